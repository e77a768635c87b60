"""A flow run's parent MLflow run: tagged, with every parameter, ended by how the block ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mlflow import MlflowClient
from pydantic import BaseModel

from pipelines.common import flow_runs, tracking


class _Params(BaseModel):
    name: str
    values: dict[str, int]


@pytest.fixture
def store(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowClient]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_RUN_ENV, raising=False)
    yield MlflowClient(tracking.use_tracking())


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
    assert run.data.tags[tracking.STAGE_TAG] == "pretrain"
    assert run.data.tags["extra"] == "y"
    assert len(run.data.params) == 151
    assert run.data.params["values.k149"] == "149"


def test_a_stage_run_nests_under_the_parent_and_a_failure_ends_it_failed(
    store: MlflowClient,
) -> None:
    params = _Params(name="x", values={})
    failing = pytest.raises(RuntimeError, match="stage broke")
    with failing, flow_runs.parent_run("adapt", "calm-owl", "flow-2", params) as run_id:
        with tracking.stage_run("adapt", run_name="child", parent_run_id=run_id) as child:
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


def test_run_links_on_the_embedded_store_list_ids_and_how_to_open_the_ui(
    store: MlflowClient,
) -> None:
    lines = flow_runs.run_links({"flow (parent)": "abc", "train": "def"})

    assert lines[:2] == ["- flow (parent): `abc`", "- train: `def`"]
    assert (
        lines[-1]
        == f"Open the MLflow UI: `mlflow ui --backend-store-uri {tracking.use_tracking()}`"
    )
