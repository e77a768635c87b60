import contextlib
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from elmo_core.presets import tiny
from pipelines.common import tracking


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real SQLite tracking store under a fresh ELMO_HOME, shared by this module's tests."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(home))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv(tracking.PARENT_RUN_ENV, raising=False)
        uri = tracking.use_tracking()
        assert uri == f"sqlite:///{home / 'mlflow.db'}"
        yield MlflowClient(uri)


def test_stage_run_nests_under_parent_from_environment(store, monkeypatch):
    with tracking.stage_run("pretrain", run_name="flow") as parent:
        parent_id = parent.info.run_id
    monkeypatch.setenv(tracking.PARENT_RUN_ENV, parent_id)
    with tracking.stage_run("train", run_name="child", tags={"extra": "x"}) as child:
        child_id = child.info.run_id
    tags = store.get_run(child_id).data.tags
    assert tags["mlflow.parentRunId"] == parent_id
    assert tags[tracking.STAGE_TAG] == "train"
    assert tags["extra"] == "x"
    assert tracking.find_run("child", "train").info.run_id == child_id
    assert tracking.find_run("child", "evaluate") is None


def test_stage_run_resumes_an_existing_run(store):
    with tracking.stage_run("train", run_name="r") as first:
        mlflow.log_metric("loss", 3.0, step=1)
    with tracking.stage_run("train", run_name="r", run_id=first.info.run_id):
        mlflow.log_metric("loss", 2.0, step=2)
    history = store.get_metric_history(first.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]


def test_log_config_flattens_to_dotted_params_and_keeps_json(store, tmp_path):
    with tracking.stage_run("train", run_name="cfg") as run:
        tracking.log_config(tiny())
    data = store.get_run(run.info.run_id).data
    assert data.params["lstm.cell_dim"] == "32"
    assert data.params["char_cnn.embedding_dim"] == "4"
    local = store.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
    assert '"projection_dim": 16' in Path(local).read_text()


def test_log_curves_writes_a_figure(store, tmp_path):
    with tracking.stage_run("train", run_name="fig") as run:
        tracking.log_curves(
            {"train (sampled)": [(1, 5.0), (2, 4.0)], "heldout": [(2, 4.5)]},
            "curves/loss.png",
            title="loss",
            ylabel="nats",
        )
    names = [a.path for a in store.list_artifacts(run.info.run_id, "curves")]
    assert names == ["curves/loss.png"]


def test_git_commit_is_a_sha_or_none():
    commit = tracking.git_commit()
    assert commit is None or len(commit) == 40


def test_embedded_store_keeps_artifacts_under_elmo_home(store):
    with tracking.stage_run("train", run_name="where"):
        pass
    experiment = store.get_experiment_by_name(tracking.EXPERIMENT)
    home = tracking.elmo_home()
    assert experiment.artifact_location == (home / "artifacts").as_uri()


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "FINISHED"), (ValueError("bad"), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_a_stage_run_ends_as_what_happened(store, raised, status):
    expected = pytest.raises(type(raised)) if raised else contextlib.nullcontext()
    with expected, tracking.stage_run("evaluate", run_name=f"ends-{status}") as run:
        run_id = run.info.run_id
        if raised:
            raise raised
    assert store.get_run(run_id).info.status == status
    assert mlflow.active_run() is None


def test_a_shared_run_leaves_the_owner_to_decide_how_it_ends(store):
    with tracking.stage_run("train", run_name="owned") as run:
        run_id = run.info.run_id
        mlflow.end_run("RUNNING")  # as if the owner were another process: the worker logs below
        with tracking.shared_run(run_id):
            mlflow.log_metric("loss", 1.0, step=1)
        assert store.get_run(run_id).info.status == "RUNNING"
        mlflow.start_run(run_id=run_id)  # the owner again, as stage_run left it
    assert store.get_run(run_id).info.status == "FINISHED"
    assert [m.value for m in store.get_metric_history(run_id, "loss")] == [1.0]


def test_a_stage_run_samples_system_metrics_often_enough_for_a_short_stage(store, monkeypatch):
    import time

    monkeypatch.setenv(tracking.SYSTEM_METRICS_INTERVAL_ENV, "0.2")
    with tracking.stage_run("evaluate", run_name="short") as run:
        time.sleep(1.5)
    with tracking.stage_run("train", run_name="driver", system_metrics=False) as quiet:
        time.sleep(0.5)

    history = store.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 3
    assert not any(
        name.startswith("system/") for name in store.get_run(quiet.info.run_id).data.metrics
    )


def test_ui_links_open_the_model_training_view() -> None:
    assert tracking.ui_url("3", "abc", server="http://mlflow:5000/") == (
        "http://mlflow:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert tracking.ui_url("3", server="http://mlflow:5000") == (
        "http://mlflow:5000/#/experiments/3?workflowType=machine_learning"
    )
