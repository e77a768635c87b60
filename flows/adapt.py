"""The ``adapt`` flow: an existing biLM (default ``models:/elmo-bilm@champion``) → task models."""

from __future__ import annotations

from prefect import flow

from flows import tasks
from flows.artifacts import adapt_markdown, publish_markdown
from flows.params import AdaptParams
from flows.runs import flow_parent_run
from pipelines.common.services import check_services


@flow(name="adapt")
def adapt(params: AdaptParams) -> list[str]:
    """Adapt ``params.bilm`` to every task; returns the registered task model URIs."""
    check_services(ray_jobs=False)
    tasks.check_task_files(params.tasks)
    with flow_parent_run("adapt", params.bilm, params) as parent:
        results = tasks.adapt(
            params.bilm, params.tasks, parent, params.bilm_options, seeds=params.seeds
        )
        run_ids = {"flow (parent)": parent, **{f"adapt {r.task}": r.run_id for r in results}}
        publish_markdown("adapt-summary", adapt_markdown(params.bilm, results, run_ids))
    return [result.model_uri for result in results]
