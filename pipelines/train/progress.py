"""Rank 0's account of a training run: a console line, MLflow metrics, curve figures, ``best/``.

Rank 0 resumes the driver's MLflow run and the checkpoint carries the curves, so a restarted or
resumed run keeps adding to the same curves and figures. Other ranks report nothing.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import mlflow
import torch

from elmo_core.model.bilm import BiLM, LossOutput
from elmo_core.perplexity import PerplexitySums
from pipelines.tracking.figures import log_curves
from pipelines.tracking.flow_runs import (
    HEALTH_TAG,
    TOKENS_PER_S_METRIC,
    TRAIN_LOSS_METRIC,
)
from pipelines.tracking.stage_runs import shared_run
from pipelines.tracking.train_progress import (
    ETA_WINDOWS,
    EXCHANGED_BYTES_METRIC,
    GRAD_NORM_METRIC,
    TRAIN_STARTED_TAG,
    TRAPPED_ROWS,
    VALIDATION_PERPLEXITY,
    VALIDATION_SAMPLE_TAG,
    StepProgress,
    ValidationProgress,
    eta_seconds,
    started_mark,
    started_tag,
)
from pipelines.train.checkpoint import SharedState
from pipelines.train.run_directory import BEST_DIR, RunDirectory

# The curve figures are redrawn after a validation at most this often, and always as the run ends:
# drawing the two takes a CPU about as long as a short run's validation does, and MLflow's own
# metric charts are live meanwhile.
FIGURE_INTERVAL_S = 60.0


@dataclass(frozen=True)
class ValidationWarning:
    """A sign in the validation curves that training went wrong while its sampled loss may still
    fall, as when one direction's state locks up at the clip from the zero state."""

    kind: Literal["rise past best", "directions parting"]
    step: int
    message: str


def validation_warnings(
    forward: Sequence[tuple[int, float]],
    backward: Sequence[tuple[int, float]],
    *,
    rise: float,
    parting: float,
) -> list[ValidationWarning]:
    """What the latest validation of the ``(step, perplexity)`` curves warns of: a direction past
    ``rise`` times its best, or the two directions, which model the same text and so stay close,
    more than ``parting`` times apart (the larger over the smaller)."""
    warnings = []
    for direction, curve in (("forward", forward), ("backward", backward)):
        if not curve:
            continue
        step, value = curve[-1]
        best_step, best = min(curve, key=lambda point: point[1])
        if value > rise * best:
            message = (
                f"{direction} validation perplexity {value:.1f} is {value / best:.2f}x its best "
                f"({best:.1f} at step {best_step})"
            )
            warnings.append(ValidationWarning("rise past best", step, message))
    if forward and backward:
        (step, forward_value), (_, backward_value) = forward[-1], backward[-1]
        larger, smaller = max(forward_value, backward_value), min(forward_value, backward_value)
        if larger > parting * smaller:
            message = (
                f"forward and backward validation perplexities part: {forward_value:.1f} and "
                f"{backward_value:.1f} ({larger / smaller:.2f}x)"
            )
            warnings.append(ValidationWarning("directions parting", step, message))
    return warnings


@dataclass(frozen=True)
class TrackedRun:
    """Where rank 0 reports: the MLflow store and run the driver opened, the run directory, and
    the driver's machine (which samples its own system metrics into the run)."""

    tracking_uri: str
    run_name: str
    run_id: str
    run_dir: str
    driver_host: str


class Progress:
    """Rank 0's reporting: a console line, MLflow metrics and curve figures; silent elsewhere."""

    def __init__(
        self,
        run: TrackedRun,
        shared: SharedState,
        *,
        rank: int,
        total_steps: int,
        log_every: int,
        validation_sentences: int,
        warn_at: tuple[float, float],
        console: bool = True,
        dense_bytes: int = 0,
    ) -> None:
        """``warn_at``: ``train.warn_rise`` and ``train.warn_parting``; ``console``: print each
        line (off where a flow logs them from the run's metrics instead); ``dense_bytes``: what
        DDP's all-reduce sends a step, logged beside the softmax rows' where workers exchange."""
        self.run, self.shared, self.active = run, shared, rank == 0
        self.dense_bytes = dense_bytes
        self.warn_rise, self.warn_parting = warn_at
        self.total, self.log_every, self.console = total_steps, log_every, console
        self.sample = f"{validation_sentences:,}-sentence heldout sample"
        self._marks = _marks((shared.step, time.time()))
        self._drawn_at = time.monotonic()  # the loop's start: a first figure a minute in
        self._drawn_points = -1
        self._reset_window()

    def _reset_window(self) -> None:
        self._window_started = time.perf_counter()
        self._sums: list[torch.Tensor] = []  # per step: (loss, forward, backward, tokens)

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """Rank 0 logs into the run's MLflow run (the driver's) for the whole loop, with its
        machine's system metrics where that is not the driver's."""
        if not self.active:
            yield
            return
        os.environ["MLFLOW_TRACKING_URI"] = self.run.tracking_uri
        host = socket.gethostname()
        node = None if host == self.run.driver_host else host
        with shared_run(self.run.run_id, node):  # the driver's run: it decides how the run ends
            started = started_tag(self.shared.step, time.time())
            self._marks = _marks(started_mark(started))  # as the flow reads it, to the millisecond
            mlflow.set_tags({TRAIN_STARTED_TAG: started, VALIDATION_SAMPLE_TAG: self.sample})
            yield

    def after_step(
        self,
        step: int,
        output: LossOutput,
        grad_norm: torch.Tensor,
        world_size: int,
        softmax_bytes: int = 0,
    ) -> None:
        """Accumulate on the device; only a logged step reads values back (waits for the GPU).
        ``softmax_bytes``: what the step's softmax exchange sent (``StepResult.softmax_bytes``)."""
        if not self.active:
            return
        parts = (output.loss, output.forward, output.backward, output.num_tokens)
        self._sums.append(torch.stack([part.detach().float() for part in parts]))
        if step % self.log_every and step != self.total:
            return
        loss, forward, backward, tokens = torch.stack(self._sums).sum(0).tolist()
        num_steps = len(self._sums)
        elapsed = time.perf_counter() - self._window_started
        tokens_per_s = tokens * world_size / max(elapsed, 1e-9)
        metrics = {
            TRAIN_LOSS_METRIC: loss / num_steps,
            f"{TRAIN_LOSS_METRIC}_forward": forward / num_steps,
            f"{TRAIN_LOSS_METRIC}_backward": backward / num_steps,
            TOKENS_PER_S_METRIC: tokens_per_s,
            GRAD_NORM_METRIC: float(grad_norm),
        }
        if world_size > 1:
            metrics[f"{EXCHANGED_BYTES_METRIC}_softmax"] = softmax_bytes
            metrics[f"{EXCHANGED_BYTES_METRIC}_dense"] = self.dense_bytes
        now = time.time()  # the metrics' timestamp, from which the flow's log takes its ETA
        mlflow.log_metrics(metrics, step=step, timestamp=int(now * 1000))
        self.shared.curves.setdefault(TRAIN_LOSS_METRIC, []).append((step, loss / num_steps))
        self._marks.append((step, int(now * 1000) / 1000))  # as the flow reads it back
        eta = eta_seconds(self.total, self._marks)
        said = StepProgress(step, self.total, loss / num_steps, tokens_per_s, float(grad_norm), eta)
        self._say(said.line())
        self._reset_window()

    def _say(self, line: str) -> None:
        if self.console:
            print(f"[train] {line}", flush=True)

    def after_validation(self, step: int, sums: PerplexitySums, best: BiLM | None) -> None:
        """Log the validation perplexities; keep the model as ``best/`` when it improved (the
        best perplexity itself is in the run's description, written when the run ends:
        :mod:`pipelines.train.stage`).

        Validation scores a fixed sample of the heldout split, not all of it: it is named
        "validation" everywhere, and "heldout perplexity" is the evaluate stage's, on every
        heldout sentence, so the two numbers are never mistaken for each other.
        """
        if not self.active:
            return
        values = {
            f"{VALIDATION_PERPLEXITY}{suffix}": value
            for suffix, value in (
                ("", sums.perplexity),
                ("_forward", sums.forward_perplexity),
                ("_backward", sums.backward_perplexity),
            )
        }
        trapped = {
            f"{TRAPPED_ROWS}_forward": sums.forward_trapped,
            f"{TRAPPED_ROWS}_backward": sums.backward_trapped,
        }
        locked_up = sums.forward_trapped + sums.backward_trapped
        if locked_up or TRAPPED_ROWS in self.shared.curves:  # zeros before the first say nothing
            self.shared.curves.setdefault(TRAPPED_ROWS, []).append((step, locked_up))
        else:
            trapped = {}
        mlflow.log_metrics({**values, **trapped}, step=step)
        for name, value in values.items():
            self.shared.curves.setdefault(name, []).append((step, value))
        if best is not None:
            RunDirectory(self.run.run_dir).put_model(best, BEST_DIR)
        validation = ValidationProgress(
            step,
            sums.perplexity,
            sums.forward_perplexity,
            sums.backward_perplexity,
            self.sample,
            sums.forward_trapped,
            sums.backward_trapped,
            sums.num_rows,
            best is not None,
        )
        self._say(validation.line())
        self._warn(step)
        if time.monotonic() - self._drawn_at >= FIGURE_INTERVAL_S:
            self.plot()

    def _warn(self, step: int) -> None:
        """Say what the validation curves warn of on the console and in the run's health tag,
        which keeps the latest warning for the flow's log (:mod:`pipelines.tracking.flow_runs`)."""
        curves = self.shared.curves
        warnings = validation_warnings(
            curves.get(f"{VALIDATION_PERPLEXITY}_forward", []),
            curves.get(f"{VALIDATION_PERPLEXITY}_backward", []),
            rise=self.warn_rise,
            parting=self.warn_parting,
        )
        for warning in warnings:
            self._say(f"WARNING step {warning.step}: {warning.message}")
        if warnings:
            messages = "; ".join(warning.message for warning in warnings)
            mlflow.set_tag(HEALTH_TAG, f"step {step}: {messages}")

    def plot(self) -> None:
        """The training-loss and validation-perplexity figures, replaced where a point was added
        since they were last drawn."""
        curves = self.shared.curves
        points = sum(map(len, curves.values()))
        if not self.active or points == self._drawn_points:
            return
        self._drawn_at, self._drawn_points = time.monotonic(), points
        log_curves(
            {"sampled loss": curves.get(TRAIN_LOSS_METRIC, [])},
            "curves/train_sampled_loss.png",
            ylabel="sampled softmax loss",
            title="training loss (sampled softmax: not comparable to perplexity)",
        )
        log_curves(
            {
                direction: curves.get(f"{VALIDATION_PERPLEXITY}{suffix}", [])
                for direction, suffix in (
                    ("mean", ""),
                    ("forward", "_forward"),
                    ("backward", "_backward"),
                )
            },
            "curves/validation_perplexity.png",
            title=f"validation perplexity (full softmax, {self.sample})",
            ylabel="perplexity",
            log_y=True,
        )


def _marks(start: tuple[int, float]) -> deque[tuple[int, float]]:
    """The loop's start, then each logged step: as many as the ETA's rate is measured over."""
    return deque([start], maxlen=ETA_WINDOWS + 1)
