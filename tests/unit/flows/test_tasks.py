"""The train task's reuse of a finished run, on the flow's plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from flows.params import TrainingParams
from flows.tasks import _train
from pipelines.common.handoff import TrainResult
from pipelines.tracking.stage_runs import ensure_experiment, use_tracking
from pipelines.train.preflight import plan_training
from pipelines.train.run_directory import FINISHED_FILE

SENTENCES = [f"w{i % 97} w{(3 * i) % 89} w{i % 5} end" for i in range(120)]  # > 64 types


@pytest.mark.parametrize("mode", ["local", "ray-job"])
def test_the_train_task_gives_a_finished_run_back_in_either_mode(
    make_dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]})
    training = TrainingParams(model="tiny", overrides=["train.max_steps=5"], mode=mode)
    plan = plan_training(training.job_config(), dataset)
    finished = TrainResult(
        run_name=plan.name,
        run_dir=plan.run_dir.url,
        model_dir=plan.run_dir.join("model"),
        best_model_dir=None,
        mlflow_run_id="r1",
        steps=5,
        total_steps=5,
        resumed_from_step=0,
        best_perplexity=None,
        stopped_early=False,
        seconds=1.0,
    )
    plan.run_dir.write_json(FINISHED_FILE, finished.model_dump(mode="json"))
    use_tracking()  # this test's store, where the finished run was tracked: the log links it
    ensure_experiment()

    with disable_run_logger():  # the task's function alone, outside a flow run
        result = _train.fn(dataset, training, "parent", plan)

    assert result == finished.model_copy(update={"already_finished": True})
