"""The train stage's one entry: a finished run is returned wherever it would train, a Ray Job
needs the jobs API, and the command line takes a resolved config or the options, not both. What
follows training gets the run's best model unless asked for the final one, and says which, on a
real MLflow SQLite store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from mlflow.entities import Run

from elmo_core.data.manifest import load_manifest
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import MODEL_DIR, write_bilm_dir
from elmo_core.presets import tiny
from pipelines.cli import train_main as main
from pipelines.common.handoff import CHECKPOINT_STEP_TAG, CHECKPOINT_TAG, TrainResult
from pipelines.evaluate.stage import evaluate_trained
from pipelines.registry.tags import DEFAULT_NAME
from pipelines.serving.bilm_loader import PATH_TAG
from pipelines.tracking import stage_runs
from pipelines.train.job_config import resolve_train_config
from pipelines.train.preflight import TrainPlan, plan_training
from pipelines.train.ray_job import write_job_config
from pipelines.train.run_directory import BEST_DIR, FINISHED_FILE
from pipelines.train.stage import train

SENTENCES = [f"w{i % 97} w{(3 * i) % 89} w{i % 5} end" for i in range(120)]  # > 64 types


@pytest.fixture
def dataset(make_dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    return make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]})


def _finish(plan: TrainPlan) -> None:
    record = {
        "run_name": plan.name,
        "run_dir": plan.run_dir.url,
        "model_dir": f"{plan.run_dir.url}/model",
        "best_model_dir": None,
        "mlflow_run_id": "r1",
        "steps": 5,
        "total_steps": 5,
        "resumed_from_step": 0,
        "best_perplexity": 12.5,
        "stopped_early": False,
        "seconds": 1.0,
    }
    Path(plan.run_dir.url).mkdir(parents=True, exist_ok=True)
    (Path(plan.run_dir.url) / FINISHED_FILE).write_text(json.dumps(record))


@pytest.mark.parametrize("where", ["local", "ray-job"])
def test_a_finished_run_is_returned_without_training_wherever_it_would_train(
    dataset: str, where: str
) -> None:
    cfg = resolve_train_config("tiny", None, ["train.max_steps=5"])
    plan = plan_training(cfg, dataset)
    assert plan.finished() is None
    _finish(plan)

    result = train(cfg, dataset, where=where)  # type: ignore[arg-type]

    assert result.already_finished and (result.steps, result.mlflow_run_id) == (5, "r1")
    assert result.run_dir == plan.run_dir.url


def test_more_workers_resume_the_same_run_a_longer_run_is_another(dataset: str) -> None:
    def planned(*overrides: str) -> str:
        return plan_training(resolve_train_config("tiny", None, list(overrides)), dataset).name

    assert planned("run.num_workers=1") == planned("run.num_workers=2")
    assert planned("train.max_steps=9") != planned("run.num_workers=1")


def test_a_ray_job_without_a_jobs_api_is_refused_naming_the_setting(dataset: str) -> None:
    with pytest.raises(ConfigError, match="RAY_API_SERVER_ADDRESS"):
        train(resolve_train_config("tiny"), dataset, where="ray-job")


def test_the_command_reads_a_job_config_and_refuses_it_beside_other_options(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = resolve_train_config("tiny", None, ["train.max_steps=5"])
    plan = plan_training(cfg, dataset)
    job_config = write_job_config(cfg, plan)
    _finish(plan)

    assert main(["--job-config", job_config, "--data", dataset, "--no-register"]) == 0
    assert f"{plan.name} already finished: 5/5 steps" in capsys.readouterr().out

    args = ["--job-config", job_config, "--set", "train.max_steps=6", "--data", dataset]
    assert main(args) == 2
    assert "takes no --model, --config or --set" in capsys.readouterr().err


# --- what follows training: the model handed on to evaluate and register -------------------------


@pytest.fixture
def store(
    dataset: str, tmp_path: Path, isolated_home: Callable[[Path], AbstractContextManager[None]]
) -> Iterator[MlflowClient]:
    """This test's own tracking store, in the ``ELMO_HOME`` the dataset fixture set."""
    with isolated_home(tmp_path):
        yield MlflowClient(stage_runs.use_tracking())


def _trained(dataset: str, *, validated: bool) -> tuple[str, TrainPlan]:
    """A finished 5-step run as training leaves it: the final model and, when it validated, a
    different best one from step 3; returns its job config and plan."""
    cfg = resolve_train_config("tiny", None, ["train.max_steps=5"])
    plan = plan_training(cfg, dataset)
    run_dir = Path(plan.run_dir.url)
    vocab_size = load_manifest(dataset).vocab.size
    for seed, name in ((0, MODEL_DIR), (1, BEST_DIR))[: 2 if validated else 1]:
        torch.manual_seed(seed)
        write_bilm_dir(BiLM(tiny(), vocab_size), run_dir / name)
    with stage_runs.stage_run("train", run_name=f"train-{plan.name}") as run:
        run_id = run.info.run_id
    finished = TrainResult(
        run_name=plan.name,
        run_dir=plan.run_dir.url,
        model_dir=str(run_dir / MODEL_DIR),
        best_model_dir=str(run_dir / BEST_DIR) if validated else None,
        mlflow_run_id=run_id,
        steps=5,
        total_steps=5,
        resumed_from_step=0,
        best_perplexity=40.0 if validated else None,
        best_step=3 if validated else None,
        stopped_early=False,
        seconds=1.0,
    )
    plan.run_dir.write_json(FINISHED_FILE, finished.model_dump(mode="json"))
    return write_job_config(cfg, plan), plan


def _stage_run(store: MlflowClient, stage: str) -> Run:
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    assert experiment is not None
    found = store.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{stage_runs.STAGE_TAG}` = '{stage}'"
    )
    assert len(found) == 1, stage
    return found[0]


@pytest.mark.parametrize(
    ("args", "checkpoint", "step", "directory", "said"),
    [
        ([], "best", "3", BEST_DIR, "the best model (step 3, validation perplexity 40.00)"),
        (["--hand-on", "final"], "final", "5", MODEL_DIR, "the final model (step 5)"),
    ],
)
def test_the_command_evaluates_and_registers_the_best_model_unless_asked_for_the_final_one(
    dataset: str,
    store: MlflowClient,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    checkpoint: str,
    step: str,
    directory: str,
    said: str,
) -> None:
    job_config, plan = _trained(dataset, validated=True)
    handed = str(Path(plan.run_dir.url) / directory)

    assert main(["--job-config", job_config, "--data", dataset, *args]) == 0

    assert f"evaluating and registering {said}: {handed}\n" in capsys.readouterr().out
    recorded = {CHECKPOINT_TAG: checkpoint, CHECKPOINT_STEP_TAG: step}
    evaluated = _stage_run(store, "evaluate")
    assert evaluated.data.params["checkpoint"] == handed
    assert evaluated.info.run_name == f"evaluate-{plan.name}"  # the run's, whichever model
    assert recorded.items() <= evaluated.data.tags.items()
    registered = _stage_run(store, "register")
    assert registered.data.tags[PATH_TAG] == str(Path(handed).resolve())
    assert recorded.items() <= registered.data.tags.items()
    version = store.get_model_version(DEFAULT_NAME, "1")
    assert version.tags[CHECKPOINT_TAG] == checkpoint  # the step is the description's
    assert f"its training run's {checkpoint} model (step {step})" in (version.description or "")


def test_a_run_that_never_validated_hands_on_its_final_model(
    dataset: str, store: MlflowClient
) -> None:
    _, plan = _trained(dataset, validated=False)
    finished = plan.finished()
    assert finished is not None

    evaluate_trained(finished, dataset)

    evaluated = _stage_run(store, "evaluate")
    assert evaluated.data.params["checkpoint"] == finished.model_dir
    assert evaluated.data.tags[CHECKPOINT_TAG] == "final"
    assert evaluated.data.tags[CHECKPOINT_STEP_TAG] == "5"
