# The same verbs CI uses. `make test` on a fresh machine sets up .venv and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-team-stack test-unit test-integration bench lint demo run deploy e2e

setup: $(VENV)/.installed

# PYTHONWARNINGS: without setuptools' "Editable installation" notice, a 10-line banner pip shows
# despite -q.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip check
	touch $@

# Two processes (pytest-xdist), each test file in one of them: a module's servers and fixtures
# start once, and one process's waits (Ray start-up, polls, subprocesses) overlap the other's work.
# Files go out in the order collected, the integration tests (the longest) first: xdist's own
# order (most tests first) left the one-test files of whole runs to the end, one process busy
# with them while the other had nothing left.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The team stack's tests (MLflow and Prefect on a real PostgreSQL, two Ray nodes, flow runs at once
# and servers restarted under them; the same flow runs on SQLite): CI's own step after `make test`.
test-team-stack: setup
	$(PY) -m pytest -q -m team_stack tests/integration

# The unit tests alone (no tests/integration): under 3 minutes on 2 cores.
test-unit: setup
	$(PY) -m pytest -q tests/unit tests/test_layering.py

test-integration: setup
	$(PY) -m pytest -q tests/integration

lint: setup
	$(VENV)/bin/ruff check elmo_core pipelines flows tests benchmarks experiments infra
	$(VENV)/bin/ruff format --check elmo_core pipelines flows tests benchmarks experiments infra
	$(VENV)/bin/mypy

# The whole pipeline on this machine: embedded Prefect, local Ray, SQLite MLflow under ELMO_HOME.
run demo: setup
	$(PY) -m flows.run_local

# prefect.yaml's deployments on PREFECT_API_URL; their flow runs start in this checkout.
deploy: setup
	ELMO_REPO=$(CURDIR) $(VENV)/bin/prefect --no-prompt deploy --all

e2e: setup
	$(PY) -m pytest -q tests/integration/test_end_to_end.py

bench: setup
	for script in benchmarks/bench_*.py; do \
		$(PY) -m benchmarks.$$(basename $$script .py) || exit 1; \
	done

# Local stack (infra/local): Prefect server + worker, MLflow server, Ray head on 127.0.0.1
# (ELMO_STACK_DATABASE=postgresql: both servers on a PostgreSQL cluster of the stack's own).
.PHONY: stack-up stack-status stack-down

stack-up: setup
	ELMO_PYTHON=$(PY) infra/local/start.sh

stack-status: setup
	ELMO_PYTHON=$(PY) infra/local/status.sh

stack-down: setup
	ELMO_PYTHON=$(PY) infra/local/stop.sh
