"""supervise's restarts, with trainers that stand in for Ray Train's: each attempt resumes from
the newest complete checkpoint, and the run fails once the workers failed more often than
``run.max_failures`` allows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ray.train.v2.api.exceptions import WorkerGroupError

from elmo_core.errors import DataError
from pipelines.train.checkpoint import CheckpointStore, StoredCheckpoint
from pipelines.train.run_directory import RunDirectory
from pipelines.train.supervision import TrainingFailed, supervise

KILLED = WorkerGroupError(
    "Training failed due to worker errors:\n[Rank 1] the worker died unexpectedly",
    {1: RuntimeError("the worker died unexpectedly")},
)


class Attempt:
    """One ``fit``: commits the checkpoints of ``steps`` (the last one half-written when
    ``then`` is an error, as a kill leaves it), then raises ``then`` or returns."""

    def __init__(self, store: CheckpointStore, steps: list[int], then: Exception | None) -> None:
        self.store, self.steps, self.then = store, steps, then

    def fit(self) -> None:
        for step in self.steps:
            self.store.run_dir.write_text(f"{StoredCheckpoint(step).name}/rank_0.pt", "part")
            if step != self.steps[-1] or self.then is None:
                self.store.commit(step, world_size=1, keep=2)
        if self.then is not None:
            raise self.then


def _trainers(
    store: CheckpointStore, attempts: list[tuple[list[int], Exception | None]]
) -> tuple[Callable[[StoredCheckpoint | None], Attempt], list[StoredCheckpoint | None]]:
    """``make_trainer`` for supervise, and the checkpoint each attempt was asked to resume from."""
    resumed: list[StoredCheckpoint | None] = []

    def make_trainer(resume: StoredCheckpoint | None) -> Attempt:
        resumed.append(resume)
        steps, then = attempts[len(resumed) - 1]
        return Attempt(store, steps, then)

    return make_trainer, resumed


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(RunDirectory(str(tmp_path / "run")))


def test_with_no_restart_allowed_a_killed_worker_fails_the_run_and_says_how_to_resume(
    store: CheckpointStore,
) -> None:
    make_trainer, resumed = _trainers(store, [([2, 4, 6, 8], KILLED)])

    with pytest.raises(TrainingFailed, match=r"failed 1 time\(s\) \(run\.max_failures=0\)") as err:
        supervise(make_trainer, store, run_name="bilm-x", max_failures=0)  # type: ignore[arg-type]

    assert "the same command resumes from the newest checkpoint" in str(err.value)
    assert resumed == [None]
    assert [c.step for c in store.complete()] == [4, 6]  # 8 was half-written; keep=2


def test_a_restart_resumes_from_the_newest_complete_checkpoint_without_the_half_written_one(
    store: CheckpointStore, capsys: pytest.CaptureFixture[str]
) -> None:
    make_trainer, resumed = _trainers(store, [([2, 4, 6], KILLED), ([8, 10], None)])

    supervise(make_trainer, store, run_name="bilm-x", max_failures=1)  # type: ignore[arg-type]

    assert resumed == [None, StoredCheckpoint(4)]
    assert [c.step for c in store.complete()] == [8, 10]
    assert store.run_dir.subdirectories("checkpoints") == ["step_000008", "step_000010"]
    printed = capsys.readouterr().out
    # the failure in a line: the last line of Ray's message
    assert "bilm-x: the workers failed ([Rank 1] the worker died unexpectedly); restart" in printed
    assert "(restart 1 of 1)" in printed and "resuming from the checkpoint at step 4" in printed


def test_a_user_error_in_a_worker_is_raised_as_itself_and_never_retried(
    store: CheckpointStore,
) -> None:
    corrupt = DataError("checksum does not match", path="/data/train/shard-0.parquet")
    failed = WorkerGroupError("worker group failed", {0: RuntimeError("wrapped")})
    failed.worker_failures[0].__cause__ = corrupt
    make_trainer, resumed = _trainers(store, [([], failed)])

    with pytest.raises(DataError, match="checksum does not match"):
        supervise(make_trainer, store, run_name="bilm-x", max_failures=3)  # type: ignore[arg-type]
    assert resumed == [None]
