"""What the flow's log says while a stage runs out of its sight (in Ray workers or a Ray job):
it looks at the stage's MLflow runs every few seconds and logs what is new, in the stage's words.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_progress_artifact,
    update_progress_artifact,
)

from flows.artifacts import run_link_line
from pipelines.tracking.flow_runs import mlflow_link, stage_progress
from pipelines.tracking.train_progress import event_order, training_progress
from pipelines.train.preflight import TrainPlan
from pipelines.train.stage import started_run

PROGRESS_LOOK_S = 2.0  # how often the flow looks at a training run's MLflow record
TRAINING_PROGRESS_KEY = "training-progress"  # the train task's progress bar in Prefect's UI


def progress_key(stage: str) -> str:
    """A stage task's progress artifact: ``training-progress``, ``adapt-progress``, ..."""
    return TRAINING_PROGRESS_KEY if stage == "train" else f"{stage}-progress"


class ProgressBar:
    """A task's progress bar in Prefect's UI (a progress artifact), with what the task does."""

    def __init__(self, stage: str, starting: str) -> None:
        created = create_progress_artifact(0.0, key=progress_key(stage), description=starting)
        self.id = cast(UUID, created)  # async_dispatch's union: called from a synchronous task
        self.percent = 0.0

    def update(self, share: float, description: str) -> None:
        """Move the bar to ``share`` (0 to 1) done, never back (a rounding or a late look)."""
        self.percent = max(self.percent, round(100.0 * min(share, 1.0), 1))
        update_progress_artifact(self.id, self.percent, description=description)

    def finished(self, summary: str) -> None:
        self.update(1.0, summary)


@dataclass
class FollowedTraining:
    """What :func:`training_followed` gives the train task: whether the run's link was logged,
    and its progress bar, which the task fills when training is done."""

    progress: ProgressBar
    linked: threading.Event = field(default_factory=threading.Event)


@contextmanager
def training_followed(plan: TrainPlan, parent_run_id: str) -> Iterator[FollowedTraining]:
    """While the block trains ``plan``'s run, :func:`following` looks at its MLflow record: it
    logs the run's link once the run exists (and sets ``linked``) with its Ray job's, then each
    step and validation the run logged since the last look (:func:`training_progress`'s values,
    in rank 0's words), and each new warning the run gives as a warning. The task's progress
    bar moves with the logged steps; before the first, it says what the run waits for. A failed
    look is skipped, never fatal."""
    logger = get_run_logger()
    starting = f"biLM {plan.name}: starting (Ray workers, the dataset, the first step)"
    followed = FollowedTraining(ProgressBar("train", starting))
    linked = followed.linked
    logged: set[tuple[int, bool]] = set()  # event_order of each step and validation logged
    warned: str | None = None  # the latest warning logged

    def look() -> None:
        nonlocal warned
        try:
            if not linked.is_set():
                started = started_run(plan)
                if started is not None:
                    linked.set()
                    logger.info(train_run_link(plan.name, started.run_id))
                    if started.ray_job is not None:
                        _link_ray_job(*started.ray_job)
            progress = training_progress(parent_run_id, max((s for s, _ in logged), default=0))
        except Exception as err:  # the tracking server may be busy: try again next time
            logger.debug("no training progress this time: %s", err)
            return
        if progress is None:  # no training run yet
            return
        if progress.health is not None and progress.health != warned:
            logger.warning("train: %s", progress.health)
            warned = progress.health
        for event in progress.events:
            if event_order(event) not in logged:
                logger.info(f"{progress.run_name}: {event.line()}")
                logged.add(event_order(event))
        if progress.total and progress.step:
            done = f"biLM {plan.name}: step {progress.step:,} of {progress.total:,}"
            followed.progress.update(progress.step / progress.total, done)

    with following(look, "training-progress"):
        yield followed


@contextmanager
def stage_followed(
    parent_run_id: str, stage: str, runs: int, starting: str
) -> Iterator[ProgressBar]:
    """While the block runs ``stage`` (its ``runs`` runs out of the flow's sight, in Ray tasks),
    each new progress line they report (:func:`~pipelines.tracking.stage_runs.report_progress`)
    is logged with the run's name, and the task's progress bar shows their mean share done (a run
    not yet started counts none) with the latest line; before any, it says ``starting``. The
    caller fills the bar once the block is done (its last look comes as the block ends). A failed
    look is skipped, never fatal."""
    logger = get_run_logger()
    bar = ProgressBar(stage, starting)
    seen: dict[str, str] = {}

    def look() -> None:
        try:
            progress = stage_progress(parent_run_id, stage)
        except Exception as err:  # the tracking server may be busy: try again next time
            logger.debug("no %s progress this time: %s", stage, err)
            return
        latest = None
        for name, (line, _) in sorted(progress.items()):
            if seen.get(name) != line:
                logger.info(f"{name}: {line}")
                seen[name] = line
                latest = f"{name}: {line}"
        if latest is not None:  # one update a look, with the mean share of every run
            bar.update(sum(p.share for p in progress.values()) / runs, latest)

    with following(look, f"{stage}-progress"):
        yield bar


@contextmanager
def following(look: Callable[[], None], name: str) -> Iterator[None]:
    """``look()`` every ``PROGRESS_LOOK_S`` seconds in a thread while the block runs (in this
    run's context, where the thread's logs and artifacts belong), and once more as it ends."""
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(PROGRESS_LOOK_S):
            look()

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(follow,), name=name)
    thread.daemon = True
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    look()


def _link_ray_job(job_id: str, dashboard: str) -> None:
    """The Ray job that trains the run, when it runs as one: a log line and a link artifact."""
    get_run_logger().info("training runs as Ray job %s: %s", job_id, dashboard)
    create_link_artifact(dashboard, link_text=f"Ray job {job_id}", key="ray-train-job")


def train_run_link(name: str, run_id: str) -> str:
    return run_link_line(f"train run of biLM {name}", mlflow_link(run_id))
