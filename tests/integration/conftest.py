"""Fixtures of the integration tests: one real local Ray, an isolated tracking store, a local S3
server (moto), and a fresh Python process to load models in.

Ray and MLflow are imported inside the fixtures that use them: the GPU suite runs tests of this
folder on a device that has neither (benchmarks/device_env.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mlflow import MlflowClient


def _start_local_ray() -> None:
    """A new local Ray for the tests (2 CPUs, no dashboard, a small object store), even when
    another runs on the machine."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024**2,
    )


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """``ray.init`` once per session: :func:`_start_local_ray`."""
    import ray

    if not ray.is_initialized():
        _start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture
def without_session_ray() -> Iterator[None]:
    """The session's local Ray (if one runs) shut down for a test that starts its own cluster,
    and started again after it."""
    import ray

    was_running = ray.is_initialized()
    ray.shutdown()
    yield
    ray.shutdown()
    if was_running:
        _start_local_ray()


@contextmanager
def _isolated_home(root: Path, *, chdir: bool) -> Iterator[None]:
    """ELMO_HOME under ``root`` (so a fresh SQLite tracking store), no outside server or parent
    run, no telemetry; with ``chdir``, ``root`` is the working directory (MLflow's ./mlruns)."""
    from pipelines.common import tracking

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(root / "home"))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.delenv(tracking.PARENT_RUN_ENV, raising=False)
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network at test time
        if chdir:
            patch.chdir(root)
        yield


@pytest.fixture(scope="session")
def isolated_home() -> Callable[[Path], AbstractContextManager[None]]:
    """``with isolated_home(root):`` a module's own store under ``root``, run from ``root``."""
    return partial(_isolated_home, chdir=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowClient]:
    """A real SQLite tracking store under a fresh ELMO_HOME, shared by a module's tests."""
    from mlflow import MlflowClient

    from pipelines.common import tracking

    with _isolated_home(tmp_path_factory.mktemp("store"), chdir=False):
        yield MlflowClient(tracking.use_tracking())


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """``free_port()``: a port on 127.0.0.1 that nothing listens on now, for a server to use."""
    return _free_port


@pytest.fixture
def s3_endpoint(monkeypatch, tmp_path) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with a ``datasets`` bucket; every AWS client of this process
    and of the processes it starts (Ray nodes) is pointed at it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # moto keeps its buckets per process, not per server: start each test from an empty store.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "ELMO_HOME": str(tmp_path / "home"),
    }.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("datasets")
    yield endpoint
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()
