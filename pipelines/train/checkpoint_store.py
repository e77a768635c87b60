"""Where a run's checkpoints live, and which of them are complete: ``checkpoints/step_NNNNNN/``.

Ray Train's own checkpoint bookkeeping resumed a killed run from an older checkpoint than the
newest on disk and left orphaned directories behind, so the run directory is the record instead:

1. every rank uploads its part (:func:`pipelines.train.checkpoints.write_checkpoint`) into the
   step's directory;
2. after a barrier on all ranks, rank 0 writes ``COMPLETE`` into it, points ``LATEST`` at it (what
   :func:`elmo_core.model.serialization.find_model_dir` follows, so ``evaluate RUN_DIR`` works while
   a run trains) and prunes to the newest ``checkpoints_to_keep``.

A checkpoint without ``COMPLETE`` never counts: a resumed run starts from the newest one that has
it, and the driver removes the others before workers start.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_core.model.serialization import LATEST_FILE
from pipelines.train.checkpoints import MODEL_DIR, TRAINER_FILE, rank_file
from pipelines.train.run_directory import RunDirectory

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_FILE = "COMPLETE"
_STEP_DIR = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint directory of the run, by its global step."""

    step: int

    @property
    def name(self) -> str:
        """Its path relative to the run directory."""
        return f"{CHECKPOINTS_DIR}/step_{self.step:06d}"


class CheckpointStore:
    """The checkpoints of one run directory: save parts, commit, find the newest, prune."""

    def __init__(self, run_dir: RunDirectory) -> None:
        self.run_dir = run_dir

    def save_part(self, step: int, part: Path) -> None:
        """Upload one rank's part (files and directories under ``part``) for ``step``."""
        checkpoint = StoredCheckpoint(step)
        for entry in sorted(part.iterdir()):
            if entry.is_dir():
                self.run_dir.put_directory(entry, f"{checkpoint.name}/{entry.name}")
            else:
                self.run_dir.put_file(entry, f"{checkpoint.name}/{entry.name}")

    def commit(
        self, step: int, world_size: int, keep: int, summary: Mapping[str, Any] | None = None
    ) -> StoredCheckpoint:
        """Mark ``step`` complete (every rank's part is uploaded) and prune to ``keep``;
        ``summary`` (JSON values) is kept in its ``COMPLETE`` record."""
        checkpoint = StoredCheckpoint(step)
        record = {**(summary or {}), "step": step, "world_size": world_size}
        self.run_dir.write_json(f"{checkpoint.name}/{COMPLETE_FILE}", record)
        self.run_dir.write_text(LATEST_FILE, checkpoint.name + "\n")
        self.prune(keep)
        return checkpoint

    def complete(self) -> list[StoredCheckpoint]:
        """Every complete checkpoint, oldest first."""
        return [c for c in self._all() if self.run_dir.exists(f"{c.name}/{COMPLETE_FILE}")]

    def record(self, checkpoint: StoredCheckpoint) -> dict[str, Any]:
        """The ``COMPLETE`` record of a complete checkpoint."""
        record = self.run_dir.read_json(f"{checkpoint.name}/{COMPLETE_FILE}")
        if record is None:
            raise ValueError(f"{checkpoint.name} is not complete")
        return record

    def newest(self) -> StoredCheckpoint | None:
        """The checkpoint a resumed run starts from."""
        complete = self.complete()
        return complete[-1] if complete else None

    def prune(self, keep: int) -> list[StoredCheckpoint]:
        """Remove all but the newest ``keep`` complete checkpoints, and incomplete ones older
        than the newest complete one (a crashed attempt's); returns what was removed."""
        complete = self.complete()
        kept = {c.step for c in complete[-keep:]}
        newest = complete[-1].step if complete else -1
        removed = [c for c in self._all() if c.step not in kept and c.step < newest]
        for checkpoint in removed:
            self.run_dir.remove(checkpoint.name)
        return removed

    def remove_incomplete(self) -> list[StoredCheckpoint]:
        """Remove every checkpoint without ``COMPLETE`` (only while no worker runs)."""
        complete = {c.step for c in self.complete()}
        removed = [c for c in self._all() if c.step not in complete]
        for checkpoint in removed:
            self.run_dir.remove(checkpoint.name)
        return removed

    @contextmanager
    def opened(self, checkpoint: StoredCheckpoint, rank: int) -> Iterator[Path]:
        """What ``rank`` reads of ``checkpoint`` as a local directory, while open."""
        if self.run_dir.local:
            yield Path(self.run_dir.path) / checkpoint.name
            return
        with tempfile.TemporaryDirectory(prefix="elmo-checkpoint-") as scratch:
            local = Path(scratch)
            for name in (MODEL_DIR, TRAINER_FILE, rank_file(rank)):
                if self.run_dir.exists(f"{checkpoint.name}/{name}"):
                    self.run_dir.get(f"{checkpoint.name}/{name}", local / name)
            yield local

    def _all(self) -> list[StoredCheckpoint]:
        steps = []
        for name in self.run_dir.subdirectories(CHECKPOINTS_DIR):
            match = _STEP_DIR.fullmatch(name)
            if match:
                steps.append(StoredCheckpoint(int(match.group(1))))
        return sorted(steps, key=lambda checkpoint: checkpoint.step)
