"""A flow run's parent MLflow run: tagged, with every parameter, ended by how the block ends."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient
from pydantic import BaseModel

from pipelines.tracking import flow_runs, stage_runs


class _Params(BaseModel):
    name: str
    values: dict[str, int]


@pytest.fixture
def store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_tracking_db: Path
) -> Iterator[MlflowClient]:
    """A store of the test's own (its tables copied, not made)."""
    shutil.copyfile(empty_tracking_db, tmp_path / "mlflow.db")
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(stage_runs.PARENT_RUN_ENV, raising=False)
    yield MlflowClient(stage_runs.use_tracking())


def test_the_parent_run_is_tagged_with_the_flow_and_holds_every_parameter(
    store: MlflowClient,
) -> None:
    # More parameters than one MLflow batch takes.
    params = _Params(name="x", values={f"k{i}": i for i in range(150)})

    with flow_runs.parent_run("pretrain", "brave-fox", "flow-1", params, {"extra": "y"}) as run_id:
        assert store.get_run(run_id).info.status == "RUNNING"

    run = store.get_run(run_id)
    assert run.info.run_name == "brave-fox"
    assert run.info.status == "FINISHED"
    assert run.data.tags[flow_runs.FLOW_RUN_TAG] == "flow-1"
    assert run.data.tags[stage_runs.STAGE_TAG] == "pretrain"
    assert run.data.tags["extra"] == "y"
    assert len(run.data.params) == 151
    assert run.data.params["values.k149"] == "149"
    # Who ran it and from what, as MLflow shows a run started with mlflow.start_run
    assert run.data.tags["mlflow.user"]
    assert run.data.tags["mlflow.source.name"] == "prefect flow pretrain"
    assert run.data.tags["mlflow.source.type"] == "JOB"


@pytest.mark.parametrize(
    ("url", "tagged"),
    [
        ("None/flow-runs/flow-run/f-1", None),  # Prefect without PREFECT_UI_URL
        (None, None),
        ("http://127.0.0.1:4200/runs/flow-run/f-1", "http://127.0.0.1:4200/runs/flow-run/f-1"),
    ],
)
def test_the_parent_run_links_the_flow_run_only_where_prefect_serves_a_ui(
    store: MlflowClient, url: str | None, tagged: str | None
) -> None:
    params = _Params(name="x", values={})
    with flow_runs.parent_run("pretrain", "p", "f-1", params, flow_run_url=url) as run_id:
        pass
    assert store.get_run(run_id).data.tags.get(flow_runs.FLOW_RUN_URL_TAG) == tagged


def test_a_stage_run_nests_under_the_parent_and_a_failure_ends_it_failed(
    store: MlflowClient,
) -> None:
    params = _Params(name="x", values={})
    failing = pytest.raises(RuntimeError, match="stage broke")
    with failing, flow_runs.parent_run("adapt", "calm-owl", "flow-2", params) as run_id:
        with stage_runs.stage_run("adapt", run_name="child", parent_run_id=run_id) as child:
            pass
        raise RuntimeError("stage broke")

    assert store.get_run(run_id).info.status == "FAILED"
    assert store.get_run(child.info.run_id).data.tags["mlflow.parentRunId"] == run_id


def test_an_interrupted_flow_ends_its_parent_run_killed(store: MlflowClient) -> None:
    params = _Params(name="x", values={})
    interrupted = pytest.raises(KeyboardInterrupt)
    with interrupted, flow_runs.parent_run("adapt", "cold-elk", "flow-3", params) as run_id:
        raise KeyboardInterrupt

    assert store.get_run(run_id).info.status == "KILLED"


def test_run_links_name_each_run_and_say_how_to_serve_the_local_ui_where_it_serves(
    store: MlflowClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage_runs.ensure_experiment()
    with stage_runs.stage_run("train", run_name="train-bilm-t") as run:
        run_id = run.info.run_id
    experiment = run.info.experiment_id
    route = f"#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"
    uri = stage_runs.use_tracking()

    lines = flow_runs.run_links({"train": run_id})
    inside = flow_runs.run_links({"train": run_id}, inside_mlflow=True)
    monkeypatch.setenv(stage_runs.MLFLOW_UI_ENV, "http://10.0.0.5:8081")
    elsewhere = flow_runs.run_links({"train": run_id})

    assert lines[0] == f"- train: [train-bilm-t](http://127.0.0.1:5000/{route})"
    assert lines[-1] == (
        f"Open the MLflow UI first: `mlflow ui --backend-store-uri {uri} --workers 1`"
    )
    assert inside == [f"- train: [train-bilm-t]({route})"]  # works on any address serving it
    assert elsewhere[0] == f"- train: [train-bilm-t](http://10.0.0.5:8081/{route})"
    assert elsewhere[-1] == (
        f"Open the MLflow UI first: `mlflow ui --backend-store-uri {uri} --host 10.0.0.5 "
        "--port 8081 --workers 1`"
    )


def test_the_summary_lands_on_the_parent_run_as_metrics_files_and_description(
    store: MlflowClient,
) -> None:
    params = _Params(name="x", values={})
    with flow_runs.parent_run("pretrain", "p", "flow-4", params, description="running") as run_id:
        assert store.get_run(run_id).data.tags["mlflow.note.content"] == "running"
        flow_runs.record_summary(
            run_id, {"heldout_perplexity": 41.5, "nan": float("nan")}, {"a.md": "# A"}, "done"
        )
    run = store.get_run(run_id)
    assert run.data.metrics == {"heldout_perplexity": 41.5}
    assert [item.path for item in store.list_artifacts(run_id)] == ["a.md"]
    assert run.data.tags["mlflow.note.content"] == "done"
