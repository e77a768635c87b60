"""What a flow run shows in the Prefect UI: tables of numbers and a summary linking to MLflow.

The builders are plain functions from stage results to rows and markdown, so they are tested
without a Prefect server; :func:`publish` hands them to Prefect's artifact API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel

from elmo_core.data.manifest import Manifest
from pipelines.adapt.stage import AdaptResult
from pipelines.common.flow_runs import run_links
from pipelines.evaluate.result import EvaluationResult
from pipelines.registry.register import RegisteredBiLM
from pipelines.train.stage import TrainResult

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
    parent_run_id: str


def dataset_rows(manifest: Manifest) -> Rows:
    """One row per split: sentences, tokens, OOV rate, shards."""
    return [
        {
            "split": name,
            "sentences": split.num_sentences,
            "tokens": split.num_tokens,
            "oov_rate": round(split.oov_rate, 6),
            "shards": len(split.shards),
            "vocabulary": manifest.vocab.size,
        }
        for name, split in manifest.splits.items()
    ]


def perplexity_rows(evaluation: EvaluationResult) -> Rows:
    """Forward, backward and their geometric mean, as the paper reports them (full softmax)."""
    return [
        {
            "split": evaluation.split,
            "direction": direction,
            "perplexity": round(value, 4),
            "tokens": evaluation.num_tokens,
        }
        for direction, value in (
            ("forward", evaluation.forward_perplexity),
            ("backward", evaluation.backward_perplexity),
            ("mean (geometric)", evaluation.perplexity),
        )
    ]


def task_rows(results: Sequence[AdaptResult]) -> Rows:
    """Per task: the main metric on dev and test with and without ELMo, and the gain."""
    rows = []
    for result in results:
        metric = result.metric
        rows.append(
            {
                "task": result.task,
                "metric": metric,
                "dev_elmo": result.elmo_dev.get(metric),
                "dev_baseline": result.baseline_dev.get(metric),
                "test_elmo": result.elmo_test.get(metric),
                "test_baseline": result.baseline_test.get(metric),
                "test_gain": result.gain.get(f"test_{metric}"),
                "model": result.model_uri,
            }
        )
    return rows


def summary_markdown(
    train: TrainResult,
    evaluation: EvaluationResult,
    model: RegisteredBiLM,
    results: Sequence[AdaptResult],
    run_ids: dict[str, str],
) -> str:
    """The run in a few lines: what was trained (or reused), the score, the models, MLflow links."""
    verb = "reused (already finished)" if train.already_finished else "trained"
    if train.resumed_from_step and not train.already_finished:
        verb = f"resumed from step {train.resumed_from_step} and finished"
    lines = [
        "# ELMo pretraining",
        "",
        f"- biLM `{train.run_name}` {verb}: {train.steps}/{train.total_steps} steps, "
        f"model in `{train.model_dir}`",
        f"- heldout perplexity {evaluation.perplexity:.2f} (forward "
        f"{evaluation.forward_perplexity:.2f}, backward {evaluation.backward_perplexity:.2f})",
        f"- registered `{model.uri}`{' (champion)' if model.champion else ''}: {_decision(model)}",
        *[f"- task `{r.task}`: `{r.model_uri}`, test {r.metric} gain {_gain(r)}" for r in results],
        "",
        "## MLflow runs",
        "",
        *run_links(run_ids),
        "",
        'Load the champion: `mlflow.pyfunc.load_model("models:/elmo-bilm@champion")`',
    ]
    return "\n".join(lines)


def adapt_markdown(bilm: str, results: Sequence[AdaptResult], run_ids: dict[str, str]) -> str:
    """The ``adapt`` flow's summary: the biLM used, one line per task model, MLflow links."""
    lines = [
        "# ELMo adaptation",
        "",
        f"- biLM `{bilm}`",
        *[f"- task `{r.task}`: `{r.model_uri}`, test {r.metric} gain {_gain(r)}" for r in results],
        "",
        "## MLflow runs",
        "",
        *run_links(run_ids),
    ]
    return "\n".join(lines)


def _decision(model: RegisteredBiLM) -> str:
    return "champion policy not applied" if model.decision is None else model.decision.reason


def _gain(result: AdaptResult) -> str:
    value = result.gain.get(f"test_{result.metric}")
    return "n/a" if value is None else f"{value:+.4f}"


def publish(key: str, tables: dict[str, Rows], markdown: str) -> None:
    """Create the flow run's table artifacts and its markdown summary."""
    for name, rows in tables.items():
        if rows:
            create_table_artifact(rows, key=f"{key}-{name}", description=name.replace("-", " "))
    create_markdown_artifact(markdown, key=f"{key}-summary", description="run summary")
