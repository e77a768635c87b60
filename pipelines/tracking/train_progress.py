"""A training run's progress in words, one wording wherever it is read: rank 0's console, and the
flow's log, which reads each logged step and validation back from the run's MLflow metrics.

Rank 0 tags the run with where and when its loop began (``TRAIN_STARTED_TAG``), so that both
compute one ETA from the same numbers: the rate since then, the start-up (Ray, loading the data,
building the model) left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from elmo_core.perplexity import describe_trapped_rows
from pipelines.tracking.flow_runs import (
    HEALTH_TAG,
    TOKENS_PER_S_METRIC,
    TOTAL_STEPS_TAG,
    TRAIN_LOSS_METRIC,
    TRAIN_SECTION,
    VALIDATION_SECTION,
)
from pipelines.tracking.stage_runs import EXPERIMENT, STAGE_TAG, use_tracking

TRAIN_STARTED_TAG = "elmo.train_started"  # "<step> <unix seconds>": where rank 0's loop began
VALIDATION_SAMPLE_TAG = "elmo.validation_sample"  # "2,000-sentence heldout sample"
GRAD_NORM_METRIC = f"{TRAIN_SECTION}/grad_norm"
VALIDATION_PERPLEXITY = f"{VALIDATION_SECTION}/perplexity"  # _forward, _backward
TRAPPED_ROWS = f"{VALIDATION_SECTION}/trapped_rows"  # _forward, _backward


def started_tag(step: int, at: float) -> str:
    """The value of ``TRAIN_STARTED_TAG``: the loop began after ``step``, at ``at``."""
    return f"{step} {at:.3f}"


def eta_seconds(step: int, total: int | None, started: str | None, at: float) -> float:
    """Seconds left at ``step`` (reached at time ``at``), at the rate since the loop began
    (``started``: the tag's value); NaN where there is no rate yet."""
    if not total or not started:
        return math.nan
    first_step, first_at = started.split()
    steps, seconds = step - int(first_step), at - float(first_at)
    return (total - step) * seconds / steps if steps > 0 and seconds > 0 else math.nan


def duration(seconds: float) -> str:
    """``1:05:07``; ``?`` where unknown."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def step_line(
    step: int, total: int | None, loss: float, tokens_per_s: float, grad_norm: float, eta: float
) -> str:
    return (
        f"step {step}/{total or '?'}  sampled loss {loss:.3f}  {tokens_per_s:,.0f} tokens/s  "
        f"grad norm {grad_norm:.2f}  ETA {duration(eta)}"
    )


def validation_line(
    step: int, perplexities: Sequence[float], sample: str, locked_up: str, best: bool
) -> str:
    """``perplexities``: the mean (geometric), forward and backward."""
    mean, forward, backward = perplexities
    return (
        f"step {step}: validation perplexity {mean:.2f} (forward {forward:.2f}, backward "
        f"{backward:.2f}) on a {sample}{'; ' + locked_up if locked_up else ''}"
        f"{'  best so far' if best else ''}"
    )


class ProgressLine(NamedTuple):
    """One line of the run's progress: a step (kind 0) or the validation after it (kind 1)."""

    step: int
    kind: int
    text: str


@dataclass(frozen=True)
class TrainingProgress:
    """The flow's training run as its MLflow run shows it now."""

    run_name: str
    step: int  # the last logged step, 0 before the first
    total: int | None  # None until the stage has tagged it
    lines: list[ProgressLine]  # each step and validation logged from the step asked about
    health: str | None  # the run's latest warning (HEALTH_TAG); None while it has given none


def training_progress(parent_run_id: str, since: int = 0) -> TrainingProgress | None:
    """Where the flow's training run is (None before it exists), and the lines of every step and
    validation it logged from step ``since`` on: what a flow's log says while training runs in
    Ray workers, local or in a Ray job, whose console the flow never sees."""
    use_tracking()
    client = MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' "
        f"and tags.`{STAGE_TAG}` = 'train'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    run = runs[0]
    tags = run.data.tags
    total = int(tags.get(TOTAL_STEPS_TAG, "0")) or None
    if TRAIN_LOSS_METRIC not in run.data.metrics:
        return TrainingProgress(run.info.run_name, 0, total, [], tags.get(HEALTH_TAG))

    def history(name: str) -> dict[int, Metric]:
        return {point.step: point for point in client.get_metric_history(run.info.run_id, name)}

    losses = history(TRAIN_LOSS_METRIC)
    lines: list[ProgressLine] = []
    rates, norms = history(TOKENS_PER_S_METRIC), history(GRAD_NORM_METRIC)
    for step, loss in losses.items():
        if step >= since:
            eta = eta_seconds(step, total, tags.get(TRAIN_STARTED_TAG), loss.timestamp / 1000)
            rate, norm = _value(rates, step), _value(norms, step)
            lines.append(ProgressLine(step, 0, step_line(step, total, loss.value, rate, norm, eta)))
    lines += _validation_lines(history, since, tags.get(VALIDATION_SAMPLE_TAG, "heldout sample"))
    return TrainingProgress(
        run.info.run_name,
        max(losses),
        total,
        sorted(lines),
        tags.get(HEALTH_TAG),
    )


def _validation_lines(
    history: Callable[[str], dict[int, Metric]], since: int, sample: str
) -> list[ProgressLine]:
    """Each validation from ``since`` on, as rank 0 words it (the rows it locked up counted, not
    the rows validated: the run does not log them)."""
    suffixes = ("", "_forward", "_backward")
    curves = [history(f"{VALIDATION_PERPLEXITY}{suffix}") for suffix in suffixes]
    trapped = [history(f"{TRAPPED_ROWS}{suffix}") for suffix in ("_forward", "_backward")]
    lines, best = [], math.inf
    for step in sorted(curves[0]):
        mean = curves[0][step].value
        if step >= since:
            perplexities = [curve[step].value if step in curve else math.nan for curve in curves]
            forward, backward = (int(_value(rows, step, 0.0)) for rows in trapped)
            locked_up = describe_trapped_rows(forward, backward, None)
            line = validation_line(step, perplexities, sample, locked_up, mean < best)
            lines.append(ProgressLine(step, 1, line))
        best = min(best, mean)
    return lines


def _value(points: Mapping[int, Metric], step: int, missing: float = math.nan) -> float:
    return points[step].value if step in points else missing
