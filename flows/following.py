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


@dataclass
class FollowedTraining:
    """What :func:`training_followed` gives the train task: whether the run's link was logged,
    and its progress bar (a Prefect progress artifact), which :meth:`finished` fills."""

    progress: UUID
    linked: threading.Event = field(default_factory=threading.Event)

    def finished(self, summary: str) -> None:
        update_progress_artifact(self.progress, 100.0, description=summary)


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
    # async_dispatch's union return: called from this synchronous task, it is the id itself
    progress = create_progress_artifact(0.0, key=TRAINING_PROGRESS_KEY, description=starting)
    followed = FollowedTraining(cast(UUID, progress))
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
            update_progress_artifact(
                followed.progress, 100.0 * progress.step / progress.total, description=done
            )

    with following(look, "training-progress"):
        yield followed


@contextmanager
def stage_followed(parent_run_id: str, stage: str) -> Iterator[None]:
    """While the block runs ``stage`` (its runs out of the flow's sight, in Ray tasks), each new
    progress line its runs report (:func:`~pipelines.tracking.stage_runs.report_progress`) is
    logged with the run's name. A failed look is skipped, never fatal."""
    logger = get_run_logger()
    seen: dict[str, str] = {}

    def look() -> None:
        try:
            progress = stage_progress(parent_run_id, stage)
        except Exception as err:  # the tracking server may be busy: try again next time
            logger.debug("no %s progress this time: %s", stage, err)
            return
        for name, line in sorted(progress.items()):
            if seen.get(name) != line:
                logger.info(f"{name}: {line}")
                seen[name] = line

    with following(look, f"{stage}-progress"):
        yield


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
