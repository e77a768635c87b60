"""The train stage's one entry: a finished run is returned wherever it would train, a Ray Job
needs the jobs API, and the command line takes a resolved config or the options, not both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elmo_core.errors import ConfigError
from pipelines.train.job_config import resolve_train_config
from pipelines.train.preflight import TrainPlan, plan_training
from pipelines.train.ray_job import write_job_config
from pipelines.train.run_directory import FINISHED_FILE
from pipelines.train.stage import main, train

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
