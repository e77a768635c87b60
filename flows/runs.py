"""This flow run as the other services see it: its MLflow parent run, the tags every stage run
carries, its address in Prefect's UI."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for
from pydantic import BaseModel

from flows.artifacts import run_link_line
from pipelines.tracking.flow_runs import FLOW_RUN_TAG, mlflow_link, parent_run, web_url
from pipelines.tracking.stage_runs import location_name, stage_run_name

# Where `prefect server start` serves the flow runs an ephemeral run left in PREFECT_HOME.
LOCAL_PREFECT_UI = "http://127.0.0.1:4200"


def flow_tags() -> dict[str, str]:
    """What every stage's MLflow run carries: the Prefect flow run it belongs to."""
    return {FLOW_RUN_TAG: str(flow_run.get_id() or "")}


@contextmanager
def flow_parent_run(flow: str, subject: str, params: BaseModel) -> Iterator[str]:
    """This flow run's MLflow parent run, named ``<flow>-<subject>-<flow run name>`` as every
    stage run is (the subject a URI or path shortened by
    :func:`~pipelines.tracking.stage_runs.location_name`), linked back to the Prefect flow run;
    yields its id once the flow's log links it (every stage's run is its child, one click
    away)."""
    name = flow_run.get_name()
    url = flow_run_url(flow_run.get_id())
    description = f"Prefect flow run {flow_run_link()} of flow `{flow_run.get_flow_name()}`: "
    description += "in progress."
    title = stage_run_name(flow, f"{location_name(subject)}-{name}")
    with parent_run(
        flow, title, flow_run.get_id(), params, description=description, flow_run_url=url
    ) as parent:
        get_run_logger().info(run_link_line("the flow run's parent run", mlflow_link(parent)))
        yield parent


def flow_run_link() -> str:
    """This flow run by name, as a markdown link to its Prefect page where it has one."""
    name, url = flow_run.get_name(), flow_run_url(flow_run.get_id())
    return f"[{name}]({url})" if web_url(url) else f"`{name}`"


def flow_run_url(flow_run_id: UUID | str | None) -> str | None:
    """A flow run in Prefect's UI: its server's, or, in ephemeral mode, the one that
    ``prefect server start`` serves from the same PREFECT_HOME (as ``make run`` prints)."""
    if flow_run_id is None:
        return None
    return url_for("flow-run", obj_id=flow_run_id, default_base_url=LOCAL_PREFECT_UI)
