"""Run Ray Train's ``fit`` to the end: restart after a failure, stop on a user error or Ctrl-C.

The driver, not Ray Train, restarts a failed worker group, each time from the newest complete
checkpoint. An :class:`~elmo_core.errors.ElmoError` would fail the same way again, so it is
re-raised as itself. ``fit`` runs in a thread so that Ctrl-C reaches the driver whatever Ray does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import ray
import ray.train
from ray.train.torch import TorchTrainer

from elmo_core.errors import ElmoError
from pipelines.train.checkpoint import CheckpointStore, StoredCheckpoint

log = logging.getLogger(__name__)

JOIN_POLL_S = 0.5


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run; ``checkpoint`` is where the same command resumes."""

    def __init__(self, run_name: str, checkpoint: StoredCheckpoint | None) -> None:
        super().__init__(run_name)
        self.run_name = run_name
        self.checkpoint = checkpoint


class TrainingFailed(RuntimeError):
    """The workers failed more often than ``run.max_failures`` allows."""


def supervise(
    make_trainer: Callable[[StoredCheckpoint | None], TorchTrainer],
    store: CheckpointStore,
    *,
    run_name: str,
    max_failures: int,
) -> None:
    """``fit`` a trainer resuming from the newest complete checkpoint, up to ``max_failures``
    restarts (-1: no limit). The outcome is in the checkpoints, not in Ray's result."""
    attempt = 0
    while True:
        for removed in store.remove_incomplete():
            log.info("removed the incomplete checkpoint %s", removed.name)
        resume = store.newest()
        if resume is not None:
            print(f"[train] {run_name}: resuming from the checkpoint at step {resume.step}")
        try:
            _fit_interruptibly(make_trainer(resume), run_name, store)
            return
        except ray.train.TrainingFailedError as failed:
            user_error = find_user_error(failed)
            if user_error is not None:
                raise user_error from None
            if max_failures != -1 and attempt >= max_failures:
                raise TrainingFailed(
                    f"{run_name}: the workers failed {attempt + 1} time(s) (run.max_failures="
                    f"{max_failures}); the same command resumes from the newest checkpoint"
                ) from failed
            attempt += 1
            limit = "unlimited" if max_failures == -1 else max_failures
            print(
                f"[train] {run_name}: the workers failed ({_first_line(failed)}); restarting "
                f"from the newest checkpoint (restart {attempt} of {limit})"
            )


def find_user_error(failed: BaseException) -> ElmoError | None:
    """The ElmoError a worker raised, if that is what failed the group."""
    failures: dict[int, Any] = getattr(failed, "worker_failures", {}) or {}
    for _, error in sorted(failures.items()):
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            if isinstance(error, ElmoError):
                return error
            seen.add(id(error))
            error = (
                getattr(error, "_base_exc", None)  # Ray Train's UserExceptionWithTraceback
                or getattr(error, "cause", None)  # a RayTaskError
                or error.__cause__
            )
    return None


def _fit_interruptibly(trainer: TorchTrainer, run_name: str, store: CheckpointStore) -> None:
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as error:  # handed to the main thread as it is
            failure.append(error)

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(JOIN_POLL_S)
    except KeyboardInterrupt:
        ray.shutdown()  # ends the job's actors: the controller and every worker
        raise TrainingInterrupted(run_name, store.newest()) from None
    if failure:
        raise failure[0]


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1][:200] if lines else type(error).__name__
