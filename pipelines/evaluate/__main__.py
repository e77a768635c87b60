"""``python -m pipelines.evaluate``: the same command as ``elmo evaluate``."""

from pipelines.evaluate.cli import main

raise SystemExit(main())
