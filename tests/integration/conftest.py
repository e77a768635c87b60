"""Fixtures of the integration tests: one real local Ray, and a fresh Python process to load in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """``ray.init`` once per session (2 CPUs, no dashboard, a small object store)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2)
    yield
    ray.shutdown()


@pytest.fixture
def fresh_python() -> Callable[[str, str, Path], Any]:
    """Run a script in a new interpreter against an MLflow store; the JSON of its last line.

    A model that loads here owes nothing to the test process's imports or state.
    """

    def run(script: str, tracking_uri: str, cwd: Path) -> Any:
        env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
        env["MLFLOW_DISABLE_TELEMETRY"] = "true"
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run
