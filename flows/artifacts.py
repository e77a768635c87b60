"""What a flow run shows in the Prefect UI: log lines, tables of numbers, a summary linking MLflow.

The builders are plain functions of the stage results, tested without a Prefect server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel

from elmo_core.data.manifest import Manifest
from elmo_core.tasks.seeds import Scores
from pipelines.adapt.stage import AdaptResult, result_line
from pipelines.analyze.table import Row, markdown
from pipelines.common.handoff import HandOn, TrainResult
from pipelines.embed.stage import EmbedResult
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry.register import RegisteredBiLM
from pipelines.tracking.flow_runs import run_links
from pipelines.tracking.stage_runs import location_link, model_link

Rows = list[dict[str, Any]]


class PretrainSummary(BaseModel):
    """What the ``pretrain`` flow returns: paths and ids, not data."""

    dataset: str
    train_run: str
    model_dir: str
    already_trained: bool
    perplexity: float
    model_uri: str
    champion: bool
    task_models: list[str]
    task_scores: list[str]  # per task: scores over seeds with and without ELMo (result_line)
    parent_run_id: str
    analysis_run_id: str | None = None  # the analyze run, when the flow ran the analysis
    analysis_headline: list[str] = []  # and its headline (pipelines.analyze.table.headline)


class AnalyzeSummary(BaseModel):
    """What the ``analyze`` flow returns: the runs and the table as text lines."""

    run_id: str
    parent_run_id: str
    table: list[str]


def dataset_rows(manifest: Manifest) -> Rows:
    """One row per split: sentences, tokens, OOV rate (%), shards."""
    return [
        {
            "split": name,
            "sentences": split.num_sentences,
            "tokens": split.num_tokens,
            "oov_%": round(100 * split.oov_rate, 3),
            "shards": len(split.shards),
            "vocabulary": manifest.vocab.size,
        }
        for name, split in manifest.splits.items()
    ]


def dataset_lines(manifest: Manifest) -> list[str]:
    """The dataset as log lines: one per split, then the vocabulary among the word types (the
    vocabulary first, then every other type seen in any split). Shards are the table's: a
    split's count follows its input files, not its size."""
    lines = [
        f"dataset {name}: {split.num_sentences:,} sentences, {split.num_tokens:,} tokens, "
        f"OOV {100 * split.oov_rate:.2f}%"
        for name, split in manifest.splits.items()
    ]
    splits = " and ".join(manifest.splits)
    vocabulary = (
        f"vocabulary {manifest.vocab.size:,} words (<S>, </S>, <UNK> included) of the "
        f"{manifest.word_types.num_types:,} word types in {splits}"
    )
    return [*lines, vocabulary]


def run_link_line(what: str, url: str) -> str:
    """A run's MLflow link as the flow's log shows it: the bare URL, which Prefect's UI makes a
    link (it shows a message as plain text, markdown included)."""
    return f"{what} in MLflow: {url}"


def registry_line(model: RegisteredBiLM, show_model: Callable[[str], str] = str) -> str:
    """What registration did, ``show_model`` writing the version's URI (as in ``result_line``)."""
    verb = "registered" if model.newly_registered else "already registered as"
    return f"{verb} {show_model(model.uri)}, alias `@{model.alias}`: {_decision(model)}"


def summary_metrics(
    evaluation: EvaluationResult, results: Sequence[AdaptResult]
) -> dict[str, float]:
    """The headline numbers of a flow run, for its MLflow parent run. A task's keys are named so
    that the UI, which orders a section's charts by name, shows its means first (baseline, ELMo,
    gain) and their standard deviations in the row under them."""
    metrics = evaluation.metrics()
    for result in results:
        elmo, baseline = Scores(tuple(result.elmo_scores)), Scores(tuple(result.baseline_scores))
        name = f"{result.task}/{result.split}_{result.metric}"
        metrics |= {
            f"{name}_mean_baseline": baseline.mean,
            f"{name}_mean_elmo": elmo.mean,
            f"{name}_mean_gain": elmo.mean - baseline.mean,
            f"{name}_sd_baseline": baseline.sd,
            f"{name}_sd_elmo": elmo.sd,
        }
    return metrics


def task_rows(results: Sequence[AdaptResult]) -> Rows:
    """Per task: the main metric's mean and sample standard deviation (sd) over the seeds,
    with and without ELMo, the size of the split it is scored on, and the registered version
    (``elmo-ner/3``: Prefect's table cuts a ``models:/`` URI under its sidebar)."""
    rows = []
    for result in results:
        elmo, baseline = Scores(tuple(result.elmo_scores)), Scores(tuple(result.baseline_scores))
        rows.append(
            {
                "task": result.task,
                "score": f"{result.split} {result.metric}",
                "examples": result.examples,  # one error moves the score by about 1/examples
                "seeds": len(result.seeds),
                "elmo": round(elmo.mean, 4),
                "elmo_sd": round(elmo.sd, 4),
                "baseline": round(baseline.mean, 4),
                "baseline_sd": round(baseline.sd, 4),
                "gain": round(elmo.mean - baseline.mean, 4),
                "model": f"{result.model_name}/{result.model_version}",  # short: the last column
            }
        )
    return rows


def summary_markdown(
    train: TrainResult,
    hand_on: HandOn,
    evaluation: EvaluationResult,
    model: RegisteredBiLM,
    results: Sequence[AdaptResult],
    run_ids: dict[str, str],
    analysis_headline: Sequence[str] = (),
    flow_run: str | None = None,
    *,
    inside_mlflow: bool = False,
) -> str:
    """The run in a few lines: the Prefect ``flow_run`` (a markdown link where it has one), what
    was trained (or reused) and which of its models went on, the score, the models (linked), the
    analysis headline, MLflow links (relative ones ``inside_mlflow``: the parent run's
    description)."""
    handed = train.handed_on(hand_on)
    show_model = partial(model_link, relative=inside_mlflow)
    analysis = ["", "## Analysis", "", *[f"- {line}" for line in analysis_headline]]
    lines = [
        "# ELMo pretraining",
        "",
        *([f"- Prefect flow run {flow_run}"] if flow_run else []),
        f"- {train.summary()}; {handed.description} in `{handed.model_dir}`",
        f"- {evaluation.summary()}",
        f"- {registry_line(model, show_model)}",
        *[f"- {result_line(r, show_model)}" for r in results],
        *(analysis if analysis_headline else []),
        "",
        "## MLflow runs",
        "",
        *run_links(run_ids, inside_mlflow=inside_mlflow),
        "",
        'Load the champion: `mlflow.pyfunc.load_model("models:/elmo-bilm@champion")`',
    ]
    return "\n".join(lines)


def adapt_markdown(bilm: str, results: Sequence[AdaptResult], run_ids: dict[str, str]) -> str:
    """The ``adapt`` flow's summary: the biLM used, one line per task model (linked), MLflow
    links."""
    lines = [
        "# ELMo adaptation",
        "",
        f"- biLM {location_link(bilm)}",
        *[f"- {result_line(r, model_link)}" for r in results],
        "",
        "## MLflow runs",
        "",
        *run_links(run_ids),
    ]
    return "\n".join(lines)


def analysis_markdown(bilm: str, rows: Sequence[Row], run_ids: dict[str, str]) -> str:
    """The analysis table of ``bilm`` and the MLflow links."""
    lines = [f"# ELMo analysis of `{bilm}`", "", markdown(rows), "## MLflow runs", ""]
    return "\n".join([*lines, *run_links(run_ids)])


def embed_markdown(result: EmbedResult, run_ids: dict[str, str]) -> str:
    """The ``embed`` flow's summary: where the vectors are, what this run did, MLflow links."""
    lines = [
        f"# ELMo vectors of {result.num_sentences:,} sentences",
        "",
        f"- output: `{result.out}` ({len(result.files)} files)",
        f"- this run: {result.num_embedded:,} sentences, {result.num_tokens:,} tokens, "
        f"{result.shards_written} shards written, {result.shards_skipped} already there",
        f"- empty lines skipped: {result.num_empty_lines:,}",
        "",
        *run_links(run_ids),
    ]
    return "\n".join(lines)


def _decision(model: RegisteredBiLM) -> str:
    return "champion policy not applied" if model.decision is None else model.decision.reason


def publish_table(key: str, rows: Rows, description: str) -> None:
    """A table artifact of the flow run (none for no rows)."""
    if rows:
        create_table_artifact(rows, key=key, description=description)


def publish_markdown(key: str, text: str, description: str = "run summary") -> None:
    """A markdown artifact of the flow run (by default its summary)."""
    create_markdown_artifact(text, key=key, description=description)
