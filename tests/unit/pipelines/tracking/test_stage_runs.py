import contextlib
from pathlib import Path

import mlflow
import pytest

from elmo_core.presets import tiny
from pipelines.tracking import stage_runs
from pipelines.tracking.logged_models import logged_model_tags


def test_stage_run_nests_under_parent_from_environment(store, monkeypatch):
    with stage_runs.stage_run("pretrain", run_name="flow") as parent:
        parent_id = parent.info.run_id
    monkeypatch.setenv(stage_runs.PARENT_RUN_ENV, parent_id)
    with stage_runs.stage_run("train", run_name="child", tags={"extra": "x"}) as child:
        child_id = child.info.run_id
    tags = store.get_run(child_id).data.tags
    assert tags["mlflow.parentRunId"] == parent_id
    assert tags[stage_runs.STAGE_TAG] == "train"
    assert tags["extra"] == "x"
    assert stage_runs.find_run("child", "train").info.run_id == child_id
    assert stage_runs.find_run("child", "evaluate") is None


def test_stage_run_resumes_an_existing_run(store):
    with stage_runs.stage_run("train", run_name="r") as first:
        mlflow.log_metric("loss", 3.0, step=1)
    with stage_runs.stage_run("train", run_name="r", run_id=first.info.run_id):
        mlflow.log_metric("loss", 2.0, step=2)
    history = store.get_metric_history(first.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]


def test_log_config_flattens_to_dotted_params_and_keeps_json(store, tmp_path):
    with stage_runs.stage_run("train", run_name="cfg") as run:
        stage_runs.log_config(tiny())
    data = store.get_run(run.info.run_id).data
    assert data.params["lstm.cell_dim"] == "32"
    assert data.params["char_cnn.embedding_dim"] == "4"
    local = store.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
    assert '"projection_dim": 16' in Path(local).read_text()


def test_git_commit_is_a_sha_or_none():
    commit = stage_runs.git_commit()
    assert commit is None or len(commit) == 40


def test_embedded_store_keeps_artifacts_under_elmo_home(store):
    with stage_runs.stage_run("train", run_name="where"):
        pass
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    home = stage_runs.elmo_home()
    assert store.tracking_uri == f"sqlite:///{home / 'mlflow.db'}"
    assert experiment.artifact_location == (home / "artifacts").as_uri()


@pytest.mark.parametrize(
    ("raised", "status"),
    [(None, "FINISHED"), (ValueError("bad"), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_a_stage_run_ends_as_what_happened(store, raised, status):
    expected = pytest.raises(type(raised)) if raised else contextlib.nullcontext()
    with expected, stage_runs.stage_run("evaluate", run_name=f"ends-{status}") as run:
        run_id = run.info.run_id
        if raised:
            raise raised
    assert store.get_run(run_id).info.status == status
    assert mlflow.active_run() is None


def test_a_shared_run_leaves_the_owner_to_decide_how_it_ends(store):
    with stage_runs.stage_run("train", run_name="owned") as run:
        run_id = run.info.run_id
        mlflow.end_run("RUNNING")  # as if the owner were another process: the worker logs below
        with stage_runs.shared_run(run_id):
            mlflow.log_metric("loss", 1.0, step=1)
        assert store.get_run(run_id).info.status == "RUNNING"
        mlflow.start_run(run_id=run_id)  # the owner again, as stage_run left it
    assert store.get_run(run_id).info.status == "FINISHED"
    assert [m.value for m in store.get_metric_history(run_id, "loss")] == [1.0]


def test_a_stage_run_samples_system_metrics_from_its_start_to_its_end(store, monkeypatch):
    import time

    monkeypatch.setenv(stage_runs.SYSTEM_METRICS_INTERVAL_ENV, "0.2")
    with stage_runs.stage_run("evaluate", run_name="short") as run:
        time.sleep(1.5)
    monkeypatch.setenv(stage_runs.SYSTEM_METRICS_INTERVAL_ENV, "30")
    with stage_runs.stage_run("register", run_name="shorter than one interval") as brief:
        pass

    history = store.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 5 and sorted(m.step for m in history) == list(range(len(history)))
    # psutil's first reading (0: no baseline yet) is not a sample; a busy machine is never idle
    assert any(m.value > 0 for m in history)
    assert store.get_metric_history(brief.info.run_id, "system/cpu_utilization_percentage")


def test_a_worker_on_another_machine_logs_its_system_metrics_under_its_name(store, monkeypatch):
    monkeypatch.setenv(stage_runs.SYSTEM_METRICS_INTERVAL_ENV, "0.1")
    with stage_runs.stage_run("train", run_name="two machines") as run:
        run_id = run.info.run_id
        mlflow.end_run("RUNNING")  # the worker's process, as in test_a_shared_run_leaves_...
        with stage_runs.shared_run(run_id, node="gpu-1"):
            pass
        with stage_runs.shared_run(run_id):  # on the driver's machine: the driver samples it
            pass
        mlflow.start_run(run_id=run_id)
    metrics = store.get_run(run_id).data.metrics
    assert "system/gpu-1/cpu_utilization_percentage" in metrics
    assert not [name for name in metrics if name.count("/") > 1 and "gpu-1" not in name]


def test_runs_are_named_by_stage_and_subject() -> None:
    assert stage_runs.stage_run_name("train", "bilm-3f2a") == "train-bilm-3f2a"
    name = stage_runs.location_name
    assert name("/home/u/.elmo/runs/bilm-3f2a/model") == "bilm-3f2a"  # what evaluate evaluates
    assert name("s3://bucket/datasets/python-docs/") == "python-docs"
    assert name("models:/elmo-bilm@champion") == "elmo-bilm@champion"
    assert name("models:/elmo-bilm/3") == "elmo-bilm-v3"  # no "/": not read as a folder
    assert name("runs:/0123abcd/model") == "0123abcd-model"


def test_a_none_setting_is_left_out_of_the_params() -> None:
    assert stage_runs.flatten_params({"a": None, "b": {"c": None, "d": 1}}) == {"b.d": "1"}


def test_the_experiment_is_created_with_a_description(store) -> None:
    stage_runs.ensure_experiment()
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    assert experiment.tags[stage_runs.DESCRIPTION_TAG] == stage_runs.EXPERIMENT_DESCRIPTION


def test_a_model_logged_for_a_run_carries_the_runs_user_and_source(store) -> None:
    tags = stage_runs.source_tags("pipelines.adapt", job=True)
    assert tags["mlflow.source.name"] == "pipelines.adapt" and tags["mlflow.source.type"] == "JOB"
    assert tags.get("mlflow.source.git.commit") == stage_runs.git_commit()
    assert tags["mlflow.user"]
    with stage_runs.stage_run("adapt", run_name="sourced", tags=tags) as run:
        pass
    logged = logged_model_tags(store.get_run(run.info.run_id))
    assert logged["mlflow.source.name"] == "pipelines.adapt" and "mlflow.user" in logged
    assert stage_runs.STAGE_TAG not in logged


def test_ui_links_open_the_model_training_view() -> None:
    assert stage_runs.ui_url("3", "abc", server="http://mlflow:5000/") == (
        "http://mlflow:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert stage_runs.ui_url("3", server="http://mlflow:5000") == (
        "http://mlflow:5000/#/experiments/3?workflowType=machine_learning"
    )
    assert stage_runs.ui_url("3", "abc", relative=True) == (  # inside the UI: any address
        "#/experiments/3/runs/abc?workflowType=machine_learning"
    )


def test_a_run_that_reported_progress_ends_saying_how_it_ended(store) -> None:
    with stage_runs.stage_run("adapt", run_name="progressing") as run:
        stage_runs.report_progress("seed 0 of 3: epoch 14 of at most 30", 0.15)
        assert store.get_run(run.info.run_id).data.tags[stage_runs.PROGRESS_SHARE_TAG] == "0.1500"
    tags = store.get_run(run.info.run_id).data.tags
    assert tags[stage_runs.PROGRESS_TAG] == "seed 0 of 3: epoch 14 of at most 30; finished"
    assert tags[stage_runs.PROGRESS_SHARE_TAG] == "1"  # all its work is done
    with pytest.raises(RuntimeError), stage_runs.stage_run("adapt", run_name="broken") as run:
        stage_runs.report_progress("seed 1 of 3: epoch 2 of at most 30", 1.2)  # held to 1
        raise RuntimeError("boom")
    tags = store.get_run(run.info.run_id).data.tags
    assert tags[stage_runs.PROGRESS_TAG] == "seed 1 of 3: epoch 2 of at most 30; failed"
    assert tags[stage_runs.PROGRESS_SHARE_TAG] == "1.0000"
    with stage_runs.stage_run("adapt", run_name="timed") as run:
        stage_runs.report_progress(
            "seed 2 (3 of 3), the baseline: epoch 9 of at most 30, ETA 0:08", 0.9
        )
    progress = store.get_run(run.info.run_id).data.tags[stage_runs.PROGRESS_TAG]
    assert progress == "seed 2 (3 of 3), the baseline: epoch 9 of at most 30; finished"  # no ETA
    with stage_runs.stage_run("evaluate", run_name="silent") as run:
        pass
    assert stage_runs.PROGRESS_TAG not in store.get_run(run.info.run_id).data.tags


def test_a_model_uri_links_its_version_page_or_for_an_alias_its_models(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5055")
    assert stage_runs.model_link("models:/elmo-ner/3") == (
        "[models:/elmo-ner/3](http://mlflow:5055/#/models/elmo-ner/versions/3"
        "?workflowType=machine_learning)"
    )
    assert stage_runs.model_link("models:/elmo bilm@champion", relative=True) == (
        "[models:/elmo bilm@champion](#/models/elmo%20bilm?workflowType=machine_learning)"
    )
    assert stage_runs.location_link("/runs/bilm-1/model") == "`/runs/bilm-1/model`"


def test_a_stage_runs_source_is_its_stage_module_however_it_was_started(store) -> None:
    with stage_runs.stage_run("evaluate", run_name="sourced-by-stage") as run:
        pass
    tags = store.get_run(run.info.run_id).data.tags
    assert tags["mlflow.source.name"] == "pipelines.evaluate"  # not pytest's entry point
    assert tags["mlflow.source.type"] == "LOCAL"  # no parent: not inside a flow


def test_a_param_past_mlflows_limit_is_cut_saying_where_the_whole_value_is() -> None:
    long = "é" * 7000
    flat = stage_runs.flatten_params({"a": {"b": long}, "c": "x" * 6000}, whole_in="config.json")

    assert flat["c"] == "x" * 6000  # at the limit: whole
    assert len(flat["a.b"]) == stage_runs.MAX_PARAM_CHARS
    assert flat["a.b"].startswith("é" * 5000)
    assert flat["a.b"].endswith("… [cut from 7,000 characters; whole in config.json]")
