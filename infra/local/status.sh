#!/usr/bin/env bash
# Status the local stack (see stack.py); extra arguments pass through, e.g. --services mlflow,ray.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${ELMO_PYTHON:-$here/../../.venv/bin/python}"
exec "$python" "$here/stack.py" status "$@"
