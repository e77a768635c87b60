"""What the flow's log says while a biLM trains, where it links a flow run in Prefect's UI, and
the train task's reuse of a finished run."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

from flows.params import TrainingParams
from flows.tasks import _train, flow_run_url, progress_due
from pipelines.train.preflight import TrainResult, plan_training
from pipelines.train.run_directory import FINISHED_FILE

FLOW_RUN = UUID("12345678-1234-5678-1234-567812345678")


def test_the_first_step_seen_is_logged_then_each_tenth_of_the_run() -> None:
    assert progress_due(100, 1500, None, seconds=0.0, interval=60.0)
    assert not progress_due(100, 1500, 100, seconds=5.0, interval=60.0)  # no new step
    assert not progress_due(140, 1500, 100, seconds=5.0, interval=60.0)  # still the first tenth
    assert progress_due(150, 1500, 140, seconds=5.0, interval=60.0)
    assert progress_due(300, 1500, 200, seconds=5.0, interval=60.0)
    assert progress_due(20, 20, 18, seconds=0.1, interval=60.0)


def test_a_long_run_is_logged_at_least_every_interval() -> None:
    total = 1_000_000  # a tenth is hours away
    assert not progress_due(1_100, total, 1_000, seconds=59.0, interval=60.0)
    assert progress_due(1_100, total, 1_000, seconds=60.0, interval=60.0)
    assert progress_due(1_100, None, 1_000, seconds=60.0, interval=60.0)  # total not yet known
    assert not progress_due(1_100, None, 1_000, seconds=1.0, interval=60.0)


def test_an_ephemeral_flow_run_links_to_the_ui_prefect_server_start_serves() -> None:
    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}):
        assert flow_run_url(FLOW_RUN) == f"http://127.0.0.1:4200/runs/flow-run/{FLOW_RUN}"


def test_a_flow_run_on_a_server_links_to_that_servers_ui() -> None:
    with temporary_settings(
        updates={PREFECT_API_URL: "http://prefect.example:4200/api"},
        restore_defaults={PREFECT_UI_URL},
    ):
        assert flow_run_url(FLOW_RUN) == f"http://prefect.example:4200/runs/flow-run/{FLOW_RUN}"


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

    result = _train.fn(dataset, training, "parent")

    assert result == finished.model_copy(update={"already_finished": True})
