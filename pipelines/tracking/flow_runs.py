"""One MLflow parent run per flow run; every stage's run is its child.

The parent is made with the tracking client, not ``mlflow.start_run``: an active fluent run in the
flow's thread would make each stage's own ``start_run(parent_run_id=...)`` fail.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple
from urllib.parse import urlparse

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from pipelines.tracking.stage_runs import (
    DESCRIPTION_TAG,
    EXPERIMENT,
    LOCAL_UI,
    PROGRESS_SHARE_TAG,
    PROGRESS_TAG,
    STAGE_TAG,
    ended_status,
    ensure_experiment,
    flatten_params,
    source_tags,
    ui_server,
    ui_url,
    use_tracking,
)

FLOW_RUN_TAG = "prefect.flow_run_id"
FLOW_RUN_URL_TAG = "prefect.flow_run_url"  # the flow run in Prefect's UI, when it serves one
TOTAL_STEPS_TAG = "elmo.total_steps"  # set by the train stage: what a progress line counts to
HEALTH_TAG = "elmo.health"  # set by the train stage: its latest warning, kept once given
# The biLM's training curves, named so that the MLflow UI, which orders chart sections by name,
# shows their sections before the task models' (task/...) and the unsectioned ones.
TRAIN_SECTION = "bilm/train"
VALIDATION_SECTION = "bilm/validation"
TRAIN_LOSS_METRIC = f"{TRAIN_SECTION}/sampled_loss"
TOKENS_PER_S_METRIC = f"{TRAIN_SECTION}/tokens_per_s"
MAX_PARAMS_PER_BATCH = 100


@contextmanager
def parent_run(
    flow: str,
    run_name: str | None,
    flow_run_id: str | None,
    params: BaseModel,
    tags: Mapping[str, str] = {},
    description: str = "",
    flow_run_url: str | None = None,
) -> Iterator[str]:
    """Open the flow run's parent run (tagged with the flow run's id, "" outside a flow run, and
    its Prefect UI address where it has one), with ``description`` on its page and the user and
    source MLflow shows for a run (the client sets none); yields its run id.

    The run ends FINISHED when the block completes, KILLED when it is interrupted and FAILED
    when it raises.
    """
    use_tracking()
    ensure_experiment()
    client = MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None  # ensure_experiment created it
    link = web_url(flow_run_url)
    run = client.create_run(
        experiment.experiment_id,
        run_name=run_name,
        tags={
            **source_tags(f"prefect flow {flow}", job=flow_run_id is not None),
            STAGE_TAG: flow,
            FLOW_RUN_TAG: flow_run_id or "",
            **({FLOW_RUN_URL_TAG: link} if link else {}),
            DESCRIPTION_TAG: description,
            **tags,
        },
    )
    run_id = run.info.run_id
    whole = flatten_params(params, whole_in="the Prefect flow run's parameters")
    flat = [Param(key, value) for key, value in whole.items()]
    for start in range(0, len(flat), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=flat[start : start + MAX_PARAMS_PER_BATCH])
    try:
        yield run_id
    except BaseException as error:
        client.set_terminated(run_id, ended_status(error))
        raise
    client.set_terminated(run_id, ended_status(None))


def web_url(url: str | None) -> str | None:
    """``url`` when it is a web address, else None: Prefect builds a flow run's UI address from
    ``PREFECT_UI_URL`` even when that is unset (``None/flow-runs/flow-run/<id>``)."""
    return url if url and urlparse(url).scheme in ("http", "https") else None


def run_links(run_ids: Mapping[str, str], *, inside_mlflow: bool = False) -> list[str]:
    """Markdown lines linking each run, by its name, in the MLflow UI's model-training view; on
    the embedded store, also the command that serves that UI. ``inside_mlflow``: for a page of
    the UI itself (a run's description): relative links, which work on whatever address serves
    it, and no word of serving it."""
    uri = use_tracking()
    client = MlflowClient()
    lines = []
    for label, run_id in run_ids.items():
        info = client.get_run(run_id).info
        link = ui_url(info.experiment_id, run_id, relative=inside_mlflow)
        lines.append(f"- {label}: [{info.run_name}]({link})")
    if inside_mlflow or urlparse(uri).scheme in ("http", "https"):
        return lines
    return [*lines, "", f"Open the MLflow UI first: `{serve_command(uri)}`"]


def serve_command(uri: str) -> str:
    """``mlflow ui`` serving the embedded store ``uri`` where :func:`ui_server` says it is, with
    one worker process: its default four did not come up on a loaded 2-core machine."""
    return f"mlflow ui --backend-store-uri {uri}{listen_flags(ui_server(), LOCAL_UI)} --workers 1"


def listen_flags(url: str, default: str) -> str:
    """`` --host H --port P`` that make a server listen at ``url``; none where that is the
    server's ``default`` address."""
    address = urlparse(url)
    if address.geturl().rstrip("/") == default:
        return ""
    return f" --host {address.hostname} --port {address.port or 80}"


def tag_run(run_id: str, tags: Mapping[str, str]) -> None:
    """Add tags to a run that another part of the flow owns (a Ray job's submission id)."""
    use_tracking()
    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def record_summary(
    parent_run_id: str,
    metrics: Mapping[str, float],
    artifacts: Mapping[str, str],
    description: str,
) -> None:
    """Make the flow's parent run its summary: the headline numbers as metrics (comparable
    across flow runs in the runs table), text files beside them, and a description."""
    use_tracking()
    client = MlflowClient()
    now = int(time.time() * 1000)
    finite = {key: value for key, value in metrics.items() if math.isfinite(value)}
    client.log_batch(parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in finite.items()])
    for name, text in artifacts.items():
        client.log_text(parent_run_id, text, name)
    client.set_tag(parent_run_id, DESCRIPTION_TAG, description)


class StageProgress(NamedTuple):
    """A stage run's latest progress line, and the share of its work done (0 to 1)."""

    line: str
    share: float


def stage_progress(parent_run_id: str, stage: str) -> dict[str, StageProgress]:
    """Each run of ``stage`` under the flow's parent run that reported progress, by name."""
    use_tracking()
    client = MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return {}
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' "
        f"and tags.`{STAGE_TAG}` = '{stage}'",
    )
    return {
        run.info.run_name: StageProgress(
            run.data.tags[PROGRESS_TAG], float(run.data.tags.get(PROGRESS_SHARE_TAG, 0.0))
        )
        for run in runs
        if PROGRESS_TAG in run.data.tags
    }


def mlflow_link(run_id: str | None = None) -> str:
    """The MLflow UI's model-training view of the project's runs, or of one of them."""
    experiment = MlflowClient(use_tracking()).get_experiment_by_name(EXPERIMENT)
    assert experiment is not None  # the flow's runs are in it
    return ui_url(experiment.experiment_id, run_id)


def mlflow_ui_hint() -> str:
    """The link that opens the runs in the MLflow UI's model-training view; on the embedded store,
    first the command that serves the UI."""
    uri, link = use_tracking(), mlflow_link()
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI: {link}"
    return f"MLflow UI: {serve_command(uri)}\n  then open {link}"
