"""A training run's progress as values: rank 0 makes them as it logs its metrics, the flow reads
them back from MLflow, and both print them in one wording (``line()``).

Both compute one ETA from the rate over the last few logged steps, counted from where rank 0's
loop began (``TRAIN_STARTED_TAG``), start-up left out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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

TRAIN_STARTED_TAG = "elmo.train_started"  # where rank 0's loop began: "step 0 at <UTC time>"
VALIDATION_SAMPLE_TAG = "elmo.validation_sample"  # "2,000-sentence heldout sample"
GRAD_NORM_METRIC = f"{TRAIN_SECTION}/grad_norm"
# what each worker sent (and received) a step, as a ring moves it: _softmax (its rows), _dense (DDP)
EXCHANGED_BYTES_METRIC = f"{TRAIN_SECTION}/exchanged_bytes"
VALIDATION_PERPLEXITY = f"{VALIDATION_SECTION}/perplexity"  # _forward, _backward
TRAPPED_ROWS = f"{VALIDATION_SECTION}/trapped_rows"  # _forward, _backward


# The ETA's rate is that of the last ETA_WINDOWS logged windows: a run that slows (a busy machine,
# a throttled chip) shows it within them, and one window's validation or checkpoint is averaged in.
ETA_WINDOWS = 5
STARTED = re.compile(r"step (\d+) at (\S+ \S+) UTC")
Mark = tuple[int, float]  # a logged step and when it was logged (unix seconds)


def started_tag(step: int, at: float) -> str:
    """The value of ``TRAIN_STARTED_TAG``: the loop began after ``step``, at ``at``, in words."""
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"step {step} at {when} UTC"


def started_mark(tag: str) -> Mark:
    """The step and time a ``TRAIN_STARTED_TAG`` value holds."""
    found = STARTED.fullmatch(tag)
    if found is None:
        raise ValueError(f"{TRAIN_STARTED_TAG} {tag!r} is not 'step <n> at <UTC time>'")
    at = datetime.strptime(found[2], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    return int(found[1]), at.timestamp()


def eta_seconds(total: int | None, marks: Sequence[Mark]) -> float:
    """Seconds left after the last of ``marks`` (the loop's start, then each logged step), at the
    rate over the last ``ETA_WINDOWS`` windows between them; NaN where there is no rate yet."""
    if not total or len(marks) < 2:
        return math.nan
    (first_step, first_at), (step, at) = marks[max(0, len(marks) - 1 - ETA_WINDOWS)], marks[-1]
    steps, seconds = step - first_step, at - first_at
    return (total - step) * seconds / steps if steps > 0 and seconds > 0 else math.nan


def duration(seconds: float) -> str:
    """``1:05:07``; ``?`` where unknown."""
    if not math.isfinite(seconds):
        return "?"
    return str(timedelta(seconds=int(seconds)))


class StepProgress(NamedTuple):
    """A logged training step: the sampled loss averaged over the steps since the last logged
    one, the rate over them, and the ETA at the rate since the loop began (NaN: no rate yet)."""

    step: int
    total: int | None  # None until the stage has tagged it
    loss: float
    tokens_per_s: float
    grad_norm: float
    eta_s: float

    def line(self) -> str:
        return (
            f"step {self.step}/{self.total or '?'}  sampled loss {self.loss:.3f}  "
            f"{self.tokens_per_s:,.0f} tokens/s  grad norm {self.grad_norm:.2f}  "
            f"ETA {duration(self.eta_s)}"
        )


class ValidationProgress(NamedTuple):
    """A validation after ``step`` on the heldout ``sample``: the mean (geometric), forward and
    backward perplexity, each direction's rows whose state locked up, and whether it is the best
    so far."""

    step: int
    perplexity: float
    forward_perplexity: float
    backward_perplexity: float
    sample: str  # "2,000-sentence heldout sample"
    forward_trapped: int
    backward_trapped: int
    num_rows: int | None  # the rows validated: rank 0 knows them, the run's metrics do not
    best: bool

    def line(self) -> str:
        locked_up = describe_trapped_rows(
            self.forward_trapped, self.backward_trapped, self.num_rows
        )
        return (
            f"step {self.step}: validation perplexity {self.perplexity:.2f} (forward "
            f"{self.forward_perplexity:.2f}, backward {self.backward_perplexity:.2f}) on a "
            f"{self.sample}{'; ' + locked_up if locked_up else ''}"
            f"{'  best so far' if self.best else ''}"
        )


ProgressEvent = StepProgress | ValidationProgress


def event_order(event: ProgressEvent) -> tuple[int, bool]:
    """Each step before the validation that follows it."""
    return event.step, isinstance(event, ValidationProgress)


@dataclass(frozen=True)
class TrainingProgress:
    """The flow's training run as its MLflow run shows it now."""

    run_name: str
    step: int  # the last logged step, 0 before the first
    total: int | None  # None until the stage has tagged it
    events: list[ProgressEvent]  # each step and validation logged from the step asked about
    health: str | None  # the run's latest warning (HEALTH_TAG); None while it has given none


def training_progress(parent_run_id: str, since: int = 0) -> TrainingProgress | None:
    """Where the flow's training run is (None before it exists), and every step and validation
    it logged from step ``since`` on, read back from its metrics: what a flow's log says while
    training runs in Ray workers, local or in a Ray job, whose console the flow never sees."""
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
    events: list[ProgressEvent] = []
    rates, norms = history(TOKENS_PER_S_METRIC), history(GRAD_NORM_METRIC)
    started = started_mark(tags[TRAIN_STARTED_TAG]) if TRAIN_STARTED_TAG in tags else None
    marks = [started] if started else []
    for step, loss in sorted(losses.items()):
        if started is not None and step > started[0]:  # not a step before a resumed loop began
            marks.append((step, loss.timestamp / 1000))
        if step >= since:
            eta = eta_seconds(total, marks) if marks and marks[-1][0] == step else math.nan
            rate, norm = _value(rates, step), _value(norms, step)
            events.append(StepProgress(step, total, loss.value, rate, norm, eta))
    sample = tags.get(VALIDATION_SAMPLE_TAG, "heldout sample")
    events += _validations(history, since, sample)
    return TrainingProgress(
        run.info.run_name,
        max(losses),
        total,
        sorted(events, key=event_order),
        tags.get(HEALTH_TAG),
    )


def _validations(
    history: Callable[[str], dict[int, Metric]], since: int, sample: str
) -> list[ValidationProgress]:
    """Each validation from ``since`` on (the rows it locked up counted, not the rows validated:
    the run does not log them)."""
    suffixes = ("", "_forward", "_backward")
    curves = [history(f"{VALIDATION_PERPLEXITY}{suffix}") for suffix in suffixes]
    trapped = [history(f"{TRAPPED_ROWS}{suffix}") for suffix in ("_forward", "_backward")]
    validations, best = [], math.inf
    for step in sorted(curves[0]):
        mean = curves[0][step].value
        if step >= since:
            forward, backward = (_value(curve, step) for curve in curves[1:])
            forward_trapped, backward_trapped = (int(_value(rows, step, 0.0)) for rows in trapped)
            validations.append(
                ValidationProgress(
                    step,
                    mean,
                    forward,
                    backward,
                    sample,
                    forward_trapped,
                    backward_trapped,
                    None,
                    mean < best,
                )
            )
        best = min(best, mean)
    return validations


def _value(points: Mapping[int, Metric], step: int, missing: float = math.nan) -> float:
    return points[step].value if step in points else missing
