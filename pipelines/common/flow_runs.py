"""One MLflow parent run per flow run; every stage's run is its child.

The parent is created with the tracking client rather than ``mlflow.start_run``: an active fluent
run in the flow's thread would make each stage's own ``start_run(parent_run_id=...)`` fail, and
the Ray job and Ray tasks that train and adapt run in other processes anyway. Stages receive the
parent's id explicitly (``parent_run_id=``); the Ray job gets it in its environment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import urlparse

from mlflow.entities import Param
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from pipelines.common.tracking import (
    EXPERIMENT,
    STAGE_TAG,
    ended_status,
    ensure_experiment,
    flatten_params,
    use_tracking,
)

FLOW_RUN_TAG = "prefect.flow_run_id"
MAX_PARAMS_PER_BATCH = 100


@contextmanager
def parent_run(
    flow: str,
    run_name: str | None,
    flow_run_id: str | None,
    params: BaseModel,
    tags: Mapping[str, str] = {},
) -> Iterator[str]:
    """Open the flow run's parent run (tagged with the flow run's id, "" outside a flow run);
    yields its run id.

    The run ends FINISHED when the block completes, KILLED when it is interrupted and FAILED
    when it raises.
    """
    use_tracking()
    ensure_experiment()
    client = MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None  # ensure_experiment created it
    run = client.create_run(
        experiment.experiment_id,
        run_name=run_name,
        tags={STAGE_TAG: flow, FLOW_RUN_TAG: flow_run_id or "", **tags},
    )
    run_id = run.info.run_id
    flat = [Param(key, value) for key, value in flatten_params(params).items()]
    for start in range(0, len(flat), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=flat[start : start + MAX_PARAMS_PER_BATCH])
    try:
        yield run_id
    except BaseException as error:
        client.set_terminated(run_id, ended_status(error))
        raise
    client.set_terminated(run_id, ended_status(None))


def run_links(run_ids: Mapping[str, str]) -> list[str]:
    """Markdown lines pointing at each run: UI links for an http tracking server, otherwise the
    run ids and the command that opens the UI on the local store."""
    uri = use_tracking()
    if urlparse(uri).scheme in ("http", "https"):
        client = MlflowClient()
        base = uri.rstrip("/")
        lines = []
        for label, run_id in run_ids.items():
            experiment = client.get_run(run_id).info.experiment_id
            lines.append(f"- {label}: [{run_id}]({base}/#/experiments/{experiment}/runs/{run_id})")
        return lines
    lines = [f"- {label}: `{run_id}`" for label, run_id in run_ids.items()]
    return [*lines, "", f"Open the MLflow UI: `mlflow ui --backend-store-uri {uri}`"]
