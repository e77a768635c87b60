"""The ``embed`` flow: a text → ELMo vectors per sentence, with a registered (or local) biLM."""

from __future__ import annotations

from prefect import flow

from flows import tasks
from flows.artifacts import embed_markdown, publish_markdown
from flows.params import EmbedParams
from flows.runs import flow_parent_run
from pipelines.common.services import check_services


@flow(name="embed")
def embed(params: EmbedParams) -> str:
    """Embed ``params.input`` with ``params.bilm``; returns where the vectors are."""
    check_services(ray_jobs=False)
    with flow_parent_run("embed", params.input, params) as parent:
        result = tasks.embed(params, parent)
        run_ids = {"flow (parent)": parent, "embed": result.run_id}
        publish_markdown("embed-summary", embed_markdown(result, run_ids))
    return result.out
