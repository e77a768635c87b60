"""Fixtures of the integration tests: one real local Ray, a local S3 server (moto), a fresh Python
process to load models in, the local stack (infra/local) on free ports, and the dataset files
registration reads (the isolated tracking store is tests/conftest.py's).

Ray and MLflow are imported inside the fixtures that use them: the GPU suite runs tests of this
folder on a device that has neither (infra/device/device_env.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import Manifest, SplitStats, VocabInfo, WordTypesInfo
from elmo_core.text.tokenize import MosesTokenizer


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


@pytest.fixture(scope="module")
def ray_session() -> None:
    """A local Ray for the module (:func:`_start_local_ray`), the one already running if the module
    before needed one too. It is shut down once the next module needs none
    (tests/conftest.py's ``pytest_runtest_teardown``): an idle Ray costs a share of a core."""
    import ray

    if not ray.is_initialized():
        _start_local_ray()


@pytest.fixture
def without_session_ray() -> Iterator[None]:
    """The module's local Ray (if one runs) shut down for a test that starts its own cluster,
    and started again after it."""
    import ray

    was_running = ray.is_initialized()
    ray.shutdown()
    yield
    ray.shutdown()
    if was_running:
        _start_local_ray()


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


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that nothing listens on now (held together while
    chosen, so no two are the same)."""
    probes = [socket.socket() for _ in range(count)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def _free_port() -> int:
    return _free_ports(1)[0]


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


STACK_PORTS = (
    "ELMO_PREFECT_PORT",
    "ELMO_MLFLOW_PORT",
    "ELMO_RAY_PORT",
    "ELMO_RAY_DASHBOARD_PORT",
    "ELMO_RAY_CLIENT_PORT",
    "ELMO_RAY_AGENT_PORT",
)


@dataclass(frozen=True)
class LocalStack:
    """The local stack driven as a user drives it: ``stack.py ARGS`` run in ``env``."""

    script: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(self.script), *args],
            env=self.env,
            cwd=self.script.parents[2],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @staticmethod
    def exports(stdout: str) -> dict[str, str]:
        """The ``export KEY=VALUE`` lines ``stack.py start`` prints, as a mapping."""
        pairs = (line.removeprefix("export ").split("=", 1) for line in stdout.splitlines())
        return {key: value for key, value in pairs}


@pytest.fixture(scope="session")
def local_stack(stack_module: ModuleType) -> Callable[..., AbstractContextManager[LocalStack]]:
    """``with local_stack(home, **settings) as stack:`` the stack, not yet started, on free ports
    with ELMO_HOME = ``home``, ``settings`` and no outside PREFECT_/MLFLOW_/RAY_ variable but the
    tests' Ray niceness; at the end it is stopped, which must succeed and leave no process of any
    service's session and a stack that ``status`` finds down, and its Ray temp folder is removed."""

    @contextmanager
    def stack(home: Path, **settings: str) -> Iterator[LocalStack]:
        outside = ("PREFECT_", "MLFLOW_", "RAY_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(outside)}
        env["RAY_worker_niceness"] = "0"  # a fair share for Ray, as tests/conftest.py says
        env.update(zip(STACK_PORTS, map(str, _free_ports(len(STACK_PORTS))), strict=True))
        env.update(ELMO_HOME=str(home), **settings)
        local = LocalStack(Path(stack_module.__file__), env)
        try:
            yield local
        finally:
            pids = home / "stack" / "pids"
            sessions = {path.stem: int(path.read_text()) for path in pids.glob("*.pid")}
            stopped = local.run("stop", timeout=120)
            shutil.rmtree(stack_module.ray_temp_dir(home), ignore_errors=True)
            assert stopped.returncode == 0, stopped.stderr
            left = {name: stack_module.session_processes(s) for name, s in sessions.items()}
            assert left == {name: [] for name in sessions}
            assert local.run("status").returncode == 1

    return stack


@pytest.fixture(scope="session")
def stack_cli(stack_module: ModuleType) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``stack_cli(env, *args)``: ``stack.py ARGS`` in a user's shell ``env``, as
    :class:`LocalStack` runs it (stop or start one service of a started stack)."""

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return LocalStack(Path(stack_module.__file__), env).run(*args)

    return run


REGISTRY_VOCAB = "<S>\n</S>\n<UNK>\nthe\ncat\n"


@pytest.fixture(scope="session")
def registry_dataset() -> Callable[[Path], Path]:
    """``registry_dataset(root) -> root``: what registration reads of a dataset, no shards: a
    five-word ``vocab.txt`` and a ``manifest.json`` recording its hash and the Moses tokenizer."""

    def make(root: Path) -> Path:
        root.mkdir(parents=True)
        (root / "vocab.txt").write_text(REGISTRY_VOCAB)
        manifest = Manifest(
            shard_format="parquet",
            shard_format_version=1,
            source="test",
            format="text",
            tokenizer=MosesTokenizer().describe(),
            params=PrepareConfig(),
            vocab=VocabInfo(size=5, sha256=hashlib.sha256(REGISTRY_VOCAB.encode()).hexdigest()),
            word_types=WordTypesInfo(num_types=0, sha256="-"),
            splits={},
            stats=SplitStats(),
        )
        (root / "manifest.json").write_text(manifest.to_json())
        return root

    return make
