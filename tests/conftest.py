"""Fixtures shared across test packages: tiny prepared datasets made by the real prepare stage,
an isolated MLflow tracking store, and the local stack's script as a module.

MLflow is imported inside the fixtures that use it: the GPU suite runs tests on a device that has
none (infra/device/device_env.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

# MLflow 3 starts a telemetry client on import; tests never reach the network.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# Ray Train's controller takes a worker's report off its one-slot queue once a poll, 2 s apart by
# default, and a second report waits for that: the tests' steps take milliseconds, a real run's
# checkpoints minutes apart never wait. Ray processes the tests start inherit it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
# Ray starts its workers at nice 15, below its own daemons. The tests' Ray shares the cores with the
# other pytest process, whose work at nice 0 then takes nearly all of a core from them: on one core
# beside one busy process, the pretrain flow's two runs did not finish their first training in
# 5 minutes at nice 15, and took 173 s in all at nice 0 (benchmarks/results/suite_slow-*.md).
# Every Ray the tests start, in this process or in a user's command, gets a fair share.
os.environ.setdefault("RAY_worker_niceness", "0")
# Two-thread torch processes (Ray workers, the commands tests run) share the cores with the suite's
# other work. With OpenMP's default policy a waiting thread spins: a step beside one busy process
# ran 7.5x slower than on one thread, and 1.5x with the threads asleep (`python -m
# benchmarks.bench_threads_under_load --smoke`). libgomp reads it as it loads, so it is set before
# torch is imported here; the processes the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A test that reaches the Prefect API outside a flow starts an ephemeral server, which Prefect waits
# 20 s for; on a loaded slow machine it took longer (`make run` waits as long: flows/run_local.py).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from elmo_core.config import PrepareConfig
from elmo_core.tasks.activation_cache import CachedActivations
from elmo_core.tasks.dataset import TaggingExample, TaskDataset
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import TaskSplit
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files

if TYPE_CHECKING:
    from mlflow import MlflowClient

MakeDataset = Callable[..., str]
STACK = Path(__file__).resolve().parents[1] / "infra" / "local" / "stack.py"

# Tests use tiny tensors: one intra-op thread avoids oversubscribing CI's two cores (the Ray
# workers and servers some tests start run beside the test process).
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` are skipped where torch sees no CUDA device (CI, laptops)."""
    if torch.cuda.is_available():
        return
    needs_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(needs_cuda)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut this process's Ray down after the last test of a module that used it, unless the next
    module asks for one (``ray_session``): an idle local Ray took 7 % of a core, and each pytest
    process would otherwise keep its Ray through every unit test after its integration tests.
    Runs after pytest has torn down the module's fixtures (``trylast``)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if nextitem is None or (
        getattr(nextitem, "module", None) is not getattr(item, "module", None)
        and "ray_session" not in nextitem.fixturenames
    ):
        ray.shutdown()


@pytest.fixture
def ieee_float32() -> Iterator[None]:
    """float32 means float32 on CUDA within the test: no TF32 in cuBLAS' GEMMs nor in cuDNN's
    convolutions (which take it by default). Saved and restored by hand: torch's backend flags
    are no attributes, so pytest's monkeypatch cannot restore them."""
    matmuls, convolutions = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmuls)
        torch.backends.cudnn.allow_tf32 = convolutions


@pytest.fixture
def make_dataset(tmp_path: Path) -> MakeDataset:
    """``make_dataset(train_lines, heldout={"file.txt": lines}, **prepare_keys) -> dataset dir``.

    Lines are whitespace-tokenized sentences. Heldout files keep their sentences in source order
    (training shards are shuffled by prepare). Each call writes a new dataset under ``tmp_path``.
    """
    calls = iter(range(1_000))

    def make(
        train: Sequence[str],
        heldout: dict[str, Sequence[str]] | None = None,
        **prepare_keys: Any,
    ) -> str:
        root = tmp_path / f"corpus-{next(calls)}"
        root.mkdir()
        train_file = root / "train.txt"
        train_file.write_text("".join(f"{line}\n" for line in train), encoding="utf-8")
        heldout_files = []
        for name, lines in (heldout or {}).items():
            path = root / name
            path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            heldout_files.append(path)
        cfg = PrepareConfig(format="text", **prepare_keys)
        corpus = CorpusFiles(str(root), "text", [train_file], heldout_files)
        out = root.parent / f"{root.name}-dataset"
        prepare_files(cfg, corpus, str(out))
        return str(out)

    return make


@pytest.fixture(scope="session")
def stack_module() -> ModuleType:
    """``infra/local/stack.py`` (a script, not a package module) loaded as a module."""
    spec = importlib.util.spec_from_file_location("elmo_local_stack", STACK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def empty_tracking_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite file with its tables made, copied into each isolated home: making the
    tables costs seconds (MLflow's migrations), a copy milliseconds."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("empty-tracking")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the default experiment's ./mlruns
        MlflowClient(f"sqlite:///{root / 'mlflow.db'}").search_experiments()
    return root / "mlflow.db"


@contextmanager
def _isolated_home(root: Path, empty_db: Path, *, chdir: bool) -> Iterator[None]:
    """ELMO_HOME under ``root`` (so a fresh SQLite tracking store, from ``empty_db``), no outside
    server or parent run, no telemetry; with ``chdir``, ``root`` is the working directory (MLflow's
    ./mlruns)."""
    from pipelines.tracking import stage_runs

    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(empty_db, home / "mlflow.db")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(home))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.delenv(stage_runs.PARENT_RUN_ENV, raising=False)
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network at test time
        if chdir:
            patch.chdir(root)
        yield


@pytest.fixture(scope="session")
def isolated_home(empty_tracking_db: Path) -> Callable[[Path], AbstractContextManager[None]]:
    """``with isolated_home(root):`` a module's own store under ``root``, run from ``root``."""
    return partial(_isolated_home, empty_db=empty_tracking_db, chdir=True)


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory, empty_tracking_db: Path
) -> Iterator[MlflowClient]:
    """A real SQLite tracking store under a fresh ELMO_HOME, shared by a module's tests."""
    from mlflow import MlflowClient

    from pipelines.tracking import stage_runs

    root = tmp_path_factory.mktemp("store")
    with _isolated_home(root, empty_tracking_db, chdir=False):
        yield MlflowClient(stage_runs.use_tracking())


def _toy_split(examples: list[TaggingExample], seed: int) -> TaskSplit:
    """The examples with random activations of 3 layers, layer 1 holding the tag (a NOUN
    dimension)."""
    lengths = np.array([len(e.tokens) for e in examples])
    rng = np.random.default_rng(seed)
    activations = rng.normal(size=(int(lengths.sum()), 3, 4)).astype(np.float32)
    tags = np.array([tag == "NOUN" for e in examples for tag in e.tags], dtype=np.float32)
    activations[:, 1, 0] += 3.0 * tags
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cache = CachedActivations(Path("unused"), "test", activations, offsets)
    return TaskSplit(TaskDataset(Path(f"split-{seed}"), examples), cache)


def _toy_examples(count: int, rare_at: int | None) -> list[TaggingExample]:
    words = ["the", "cat", "sat", "dog", "ran"]
    examples = [
        TaggingExample(words[:3], ["DET", "NOUN", "VERB"])
        if i % 2
        else TaggingExample([words[0], words[3], words[4]], ["DET", "NOUN", "VERB"])
        for i in range(count)
    ]
    if rare_at is not None:  # one sentence with a tag nowhere else
        examples[rare_at] = TaggingExample(["wow", "cat"], ["INTJ", "NOUN"])
    return examples


def _toy_analysis() -> tuple[TaskConfig, dict[str, TaskSplit]]:
    task = TaskConfig(
        name="toy",
        type="tagging",
        format="conllu",
        train=Path("unused"),
        head={"hidden_dim": 4, "dropout": 0.0},  # type: ignore[arg-type]
        training={"epochs": 2, "batch_size": 4, "lr": 0.05, "patience": None},  # type: ignore[arg-type]
    )
    splits = {
        "train": _toy_split(_toy_examples(8, rare_at=7), 0),
        "dev": _toy_split(_toy_examples(4, rare_at=0), 1),  # INTJ in dev: fractions keep tags
    }
    return task, splits


@pytest.fixture
def toy_analysis() -> Callable[[], tuple[TaskConfig, dict[str, TaskSplit]]]:
    """A tagging task the analysis trains in seconds: a fresh config and splits each call, with
    made-up activations (analyze_task's unit tests, and its runner on Ray)."""
    return _toy_analysis
