"""The per-worker training loop on CPU, without Ray: the same seed gives the same losses, and a run
stopped after its checkpoint at step 3 and resumed equals 6 straight steps, loss for loss and
weight for weight. Progress goes to a real MLflow SQLite store under ``tmp_path``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from elmo_core.model.serialization import load_bilm
from pipelines.common import tracking
from pipelines.train.checkpoints import MODEL_DIR
from pipelines.train.config import resolve_train_config
from pipelines.train.loop import WorkerConfig, train_loop
from pipelines.train.runtime import LocalRuntime, Metrics

STEPS = 6
NUM_WORDS = 100  # above the tiny preset's 64 sampled candidates: sampling draws from the RNG
RECIPE = [
    "train.batch_size=4",
    "train.unroll_steps=5",
    "train.log_every=1",  # one logged loss per step
    "train.checkpoint_every=3",
    "train.validate_every=3",
]


class Preempted(Exception):
    """The job stopped right after a checkpoint (a preempted machine)."""


class PreemptedAfterFirstCheckpoint(LocalRuntime):
    def report(self, metrics: Metrics, checkpoint_dir: Path) -> None:
        super().report(metrics, checkpoint_dir)
        raise Preempted


@pytest.fixture
def dataset(make_dataset) -> str:
    rng = random.Random(0)

    def sentences(count: int) -> list[str]:
        lengths = [rng.randint(3, 9) for _ in range(count)]
        return [" ".join(f"w{rng.randrange(NUM_WORDS)}" for _ in range(n)) for n in lengths]

    return make_dataset(sentences(200), heldout={"heldout.txt": sentences(20)})


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv(tracking.PARENT_RUN_ENV, raising=False)
    return MlflowClient(tracking.use_tracking())


def _config(dataset: str, tmp_path: Path, name: str) -> WorkerConfig:
    """What the driver would resolve: the tiny model, 6 steps, an MLflow run opened for it."""
    with tracking.stage_run("train", run_name=name) as run:
        run_id = run.info.run_id
    (tmp_path / name).mkdir()  # the run directory, where the driver records the MLflow run
    return WorkerConfig(
        job=resolve_train_config("tiny", None, RECIPE),
        data=dataset,
        run_dir=str(tmp_path / name),
        run_name=name,
        total_steps=STEPS,
        validation_windows=2,
        mlflow_tracking_uri=tracking.use_tracking(),
        mlflow_run_id=run_id,
    )


def _history(store: MlflowClient, cfg: WorkerConfig, key: str) -> list[float]:
    history = store.get_metric_history(cfg.mlflow_run_id, key)
    return [metric.value for metric in sorted(history, key=lambda metric: metric.step)]


def _losses(store: MlflowClient, cfg: WorkerConfig) -> list[float]:
    return _history(store, cfg, "train/sampled_loss")


def _final_weights(runtime: LocalRuntime) -> dict[str, torch.Tensor]:
    return load_bilm(runtime.checkpoints()[-1] / MODEL_DIR).state_dict()


def _assert_same_weights(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        assert torch.equal(tensor, expected[name]), name


def test_the_same_seed_gives_the_same_losses_and_weights(store, dataset, tmp_path) -> None:
    runs = []
    for name in ("first", "second"):
        cfg = _config(dataset, tmp_path, name)
        runtime = LocalRuntime(tmp_path / name / "checkpoints")
        train_loop(cfg, runtime)
        runs.append((_losses(store, cfg), _final_weights(runtime), runtime.reported))

    (first_losses, first_weights, first_reports), (second_losses, second_weights, _) = runs
    assert len(first_losses) == STEPS and all(loss > 0 for loss in first_losses)
    assert len(set(first_losses)) > 1  # the steps did train
    assert second_losses == first_losses
    _assert_same_weights(second_weights, first_weights)
    assert [report["step"] for report in first_reports] == [3, STEPS]


def test_three_steps_checkpoint_resume_three_steps_equals_six_straight(
    store, dataset, tmp_path
) -> None:
    straight_cfg = _config(dataset, tmp_path, "straight")
    straight = LocalRuntime(tmp_path / "straight-checkpoints")
    train_loop(straight_cfg, straight)

    resumed_cfg = _config(dataset, tmp_path, "resumed")
    checkpoints = tmp_path / "resumed-checkpoints"
    with pytest.raises(Preempted):
        train_loop(resumed_cfg, PreemptedAfterFirstCheckpoint(checkpoints))
    assert len(_losses(store, resumed_cfg)) == 3
    resumed = LocalRuntime(checkpoints)  # a new session on the same storage: resumes
    train_loop(resumed_cfg, resumed)

    assert [report["resumed_from_step"] for report in resumed.reported] == [3]
    assert [report["step"] for report in resumed.reported] == [STEPS]
    assert _losses(store, resumed_cfg) == _losses(store, straight_cfg)
    _assert_same_weights(_final_weights(resumed), _final_weights(straight))
    assert resumed.reported[-1]["best_perplexity"] == straight.reported[-1]["best_perplexity"]
    validation = [_history(store, cfg, "val/perplexity") for cfg in (resumed_cfg, straight_cfg)]
    assert len(validation[0]) == 2 and validation[0] == validation[1]
