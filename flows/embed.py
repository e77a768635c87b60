"""The ``embed`` flow: a text → ELMo vectors per sentence, with a registered (or local) biLM.

    prefect deployment run embed/smoke --watch

One MLflow parent run per flow run, the stage's ``embed`` run its child. The vectors are written
by the stage's actor pool on Ray (:mod:`pipelines.embed.stage`); a re-run of the same parameters
skips the shards already written, so a stopped run resumes.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from flows import tasks
from flows.artifacts import publish_markdown
from flows.embed_params import EmbedParams
from pipelines.common.services import check_services
from pipelines.embed import stage as embed_stage
from pipelines.embed.stage import EmbedResult
from pipelines.tracking.flow_runs import run_links


@task(name="embed")
def embed_text(params: EmbedParams, parent_run_id: str) -> EmbedResult:
    """The embed stage on ``params``, its run a child of the flow's."""
    result = embed_stage.embed(
        params.bilm,
        params.input,
        params.out_dir(),
        options=params.bilm_options,
        output=params.output,
        format=params.format,
        dtype=params.dtype,
        batch_size=params.batch_size,
        concurrency=params.concurrency,
        sentences_per_shard=params.sentences_per_shard,
        tokenized=params.tokenized,
        manifest=params.manifest,
        parent_run_id=parent_run_id,
        tags=tasks.flow_tags(),
    )
    get_run_logger().info(embed_stage.summary_line(result))
    return result


@flow(name="embed")
def embed(params: EmbedParams) -> str:
    """Embed ``params.input`` with ``params.bilm``; returns where the vectors are."""
    check_services(ray_jobs=False)
    with tasks.flow_parent_run("embed", params.input, params) as parent:
        result = embed_text(params, parent)
        links = run_links({"flow (parent)": parent, "embed": result.run_id})
        publish_markdown("embed-summary", _summary(result, links))
    return result.out


def _summary(result: EmbedResult, links: list[str]) -> str:
    return "\n".join(
        [
            f"# ELMo vectors of {result.num_sentences:,} sentences",
            "",
            f"- output: `{result.out}` ({len(result.files)} files)",
            f"- this run: {result.num_embedded:,} sentences, {result.num_tokens:,} tokens, "
            f"{result.shards_written} shards written, {result.shards_skipped} already there",
            f"- empty lines skipped: {result.num_empty_lines:,}",
            "",
            *links,
        ]
    )
