"""The per-worker training loop on CPU, without Ray: the same seed gives the same losses (batches
built in the loop or by loader processes alike), and a run stopped while saving its step-6
checkpoint, resumed from the complete one at step 3, equals 6 straight steps, loss for loss and
weight for weight. Progress goes to a real MLflow SQLite store under ``tmp_path``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from elmo_core.model.serialization import MODEL_DIR, read_bilm_dir
from elmo_core.model.warm_start import WARMUP_FILE, WARMUP_TOKENS
from pipelines.tracking import stage_runs
from pipelines.tracking.flow_runs import TRAIN_LOSS_METRIC, VALIDATION_SECTION
from pipelines.train.checkpoint import CheckpointStore
from pipelines.train.job_config import resolve_train_config
from pipelines.train.run_directory import RunDirectory
from pipelines.train.worker import LocalRuntime, Metrics, WorkerConfig, train_loop

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
    """The job stopped while a checkpoint was being saved (a preempted machine)."""


class PreemptedDuringSecondCheckpoint(LocalRuntime):
    """Stops after the second checkpoint's parts are saved, before it is committed."""

    def report(self, metrics: Metrics) -> None:
        if len(self.reported) == 1:
            raise Preempted
        super().report(metrics)


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
    monkeypatch.delenv(stage_runs.PARENT_RUN_ENV, raising=False)
    return MlflowClient(stage_runs.use_tracking())


def _config(
    dataset: str,
    tmp_path: Path,
    name: str,
    resume_step: int | None = None,
    overrides: tuple[str, ...] = (),
) -> WorkerConfig:
    """What the driver would resolve: the tiny model, 6 steps, an MLflow run opened for it."""
    with stage_runs.stage_run("train", run_name=name) as run:
        run_id = run.info.run_id
    (tmp_path / name).mkdir()  # the run directory, where the driver records the MLflow run
    return WorkerConfig(
        job=resolve_train_config("tiny", None, [*RECIPE, *overrides]),
        data=dataset,
        run_dir=str(tmp_path / name),
        run_name=name,
        total_steps=STEPS,
        validation_windows=2,
        mlflow_tracking_uri=stage_runs.use_tracking(),
        mlflow_run_id=run_id,
        resume_step=resume_step,
    )


def _history(store: MlflowClient, cfg: WorkerConfig, key: str) -> list[float]:
    history = store.get_metric_history(cfg.mlflow_run_id, key)
    return [metric.value for metric in sorted(history, key=lambda metric: metric.step)]


def _losses(store: MlflowClient, cfg: WorkerConfig) -> list[float]:
    return _history(store, cfg, TRAIN_LOSS_METRIC)


def _store(cfg: WorkerConfig) -> CheckpointStore:
    return CheckpointStore(RunDirectory(cfg.run_dir))


def _final_weights(cfg: WorkerConfig) -> dict[str, torch.Tensor]:
    final = _store(cfg).newest()
    assert final is not None and final.step == STEPS
    return read_bilm_dir(Path(cfg.run_dir) / final.name / MODEL_DIR).state_dict()


def _assert_same_weights(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        assert torch.equal(tensor, expected[name]), name


def test_the_same_seed_gives_the_same_losses_and_weights(store, dataset, tmp_path, capsys) -> None:
    runs = []
    # the second run's batches are built ahead by two loader processes, as on a GPU
    for name, workers in (("first", 0), ("second", 2)):
        cfg = _config(dataset, tmp_path, name, overrides=(f"run.data_workers={workers}",))
        runtime = LocalRuntime()
        train_loop(cfg, runtime)
        runs.append((_losses(store, cfg), _final_weights(cfg), runtime.reported))

    (first_losses, first_weights, first_reports), (second_losses, second_weights, reports) = runs
    assert len(first_losses) == STEPS and all(loss > 0 for loss in first_losses)
    assert len(set(first_losses)) > 1  # the steps did train
    assert second_losses == first_losses
    _assert_same_weights(second_weights, first_weights)
    assert [report["step"] for report in first_reports] == [3, STEPS]
    # the record says where the best validation perplexity was measured (the first is the best
    # so far)
    validations = store.get_metric_history(cfg.mlflow_run_id, f"{VALIDATION_SECTION}/perplexity")
    assert reports[0]["best_step"] == 3
    assert reports[-1]["best_step"] == min(validations, key=lambda metric: metric.value).step
    # validation scores a sample of the heldout split: never called "heldout perplexity"
    printed = capsys.readouterr().out
    assert "validation perplexity" in printed and "on a 20-sentence heldout sample" in printed
    assert "heldout perplexity" not in printed
    # the best perplexity is the stage's to log once, at the end: not a second curve
    metrics = set(store.get_run(cfg.mlflow_run_id).data.metrics)
    assert f"{VALIDATION_SECTION}/perplexity" in metrics
    assert f"{VALIDATION_SECTION}/best_perplexity" not in metrics
    # the model is saved with the training sentences its stateless inference starts after
    final = _store(cfg).newest()
    assert final is not None
    model_dir = Path(cfg.run_dir) / final.name / MODEL_DIR
    warmup = [line.split() for line in (model_dir / WARMUP_FILE).read_text().splitlines()]
    assert sum(map(len, warmup)) >= WARMUP_TOKENS
    assert all(token.startswith("w") for sentence in warmup for token in sentence)
    assert read_bilm_dir(model_dir).start_state(1, torch.float32) is not None


def test_three_steps_checkpoint_resume_three_steps_equals_six_straight(
    store, dataset, tmp_path
) -> None:
    restarts = ("train.state_reset=0.3",)  # rows restarted from zero: drawn the same on resume
    straight_cfg = _config(dataset, tmp_path, "straight", overrides=restarts)
    straight = LocalRuntime()
    train_loop(straight_cfg, straight)

    stopped_cfg = _config(dataset, tmp_path, "resumed", overrides=restarts)
    with pytest.raises(Preempted):
        train_loop(stopped_cfg, PreemptedDuringSecondCheckpoint())
    assert len(_losses(store, stopped_cfg)) == STEPS  # trained on, but step 6 is not committed
    checkpoints = _store(stopped_cfg)
    assert [c.step for c in checkpoints.remove_incomplete()] == [STEPS]  # what the driver does
    newest = checkpoints.newest()
    assert newest is not None and newest.step == 3
    resumed_cfg = stopped_cfg.model_copy(update={"resume_step": newest.step})
    resumed = LocalRuntime()
    train_loop(resumed_cfg, resumed)

    assert [report["resumed_from_step"] for report in resumed.reported] == [3]
    assert [report["step"] for report in resumed.reported] == [STEPS]
    straight_losses = _losses(store, straight_cfg)
    # steps 4-6 were logged twice, before the stop and after the resume: the same values
    assert sorted(_losses(store, resumed_cfg)) == sorted(straight_losses + straight_losses[3:])
    _assert_same_weights(_final_weights(resumed_cfg), _final_weights(straight_cfg))
    assert resumed.reported[-1]["best_perplexity"] == straight.reported[-1]["best_perplexity"]
    assert resumed.reported[-1]["best_step"] == straight.reported[-1]["best_step"]
