"""Training checkpoints: all a run needs to continue exactly, kept in ``checkpoints/step_NNNNNN/``.

Every rank adds its part: rank 0 the model and optimiser state, each rank its RNG states, stream
positions and LSTM states. The run directory, not Ray Train's bookkeeping, is the record (Ray
resumed killed runs from an older checkpoint than the newest): after a barrier rank 0 writes
``COMPLETE`` and points ``LATEST`` at the step; a checkpoint without ``COMPLETE`` never counts.
"""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_core.model.bilm import BiLM, BiLMState
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.model.serialization import LATEST_FILE, MODEL_DIR, write_bilm_dir
from pipelines.train.run_directory import RunDirectory

TRAINER_FILE = "trainer.pt"
CHECKPOINTS_DIR = "checkpoints"
COMPLETE_FILE = "COMPLETE"
_STEP_DIR = re.compile(r"step_(\d+)")


# --- what a checkpoint holds ---------------------------------------------------------------------


@dataclass
class SharedState:
    """What every rank agrees on, written once by rank 0."""

    step: int
    world_size: int
    mlflow_run_id: str | None = None
    best_perplexity: float | None = None
    best_step: int | None = None  # where best_perplexity was measured (older checkpoints: None)
    validations_since_best: int = 0
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass
class RankState:
    """One rank's position: RNG, the two streams' ``state_dict()`` s, the carried LSTM states."""

    rng: dict[str, Any]
    forward_stream: dict[str, Any]
    backward_stream: dict[str, Any]
    lstm_state: BiLMState | None


@dataclass
class LoadedCheckpoint:
    model_dir: Path
    optimizer: dict[str, Any]
    shared: SharedState
    rank: RankState | None  # None when this rank had no file (the world size changed)


def write_checkpoint(
    directory: Path,
    rank: int,
    *,
    bilm: BiLM,
    optimizer: torch.optim.Optimizer,
    shared: SharedState,
    rank_state: RankState,
) -> Path:
    """Write this rank's part of a checkpoint into ``directory``: ``rank_{r}.pt`` (its RNG states,
    stream positions and LSTM states); rank 0 adds ``model/`` and ``trainer.pt`` (optimiser,
    step, best validation, MLflow run id, curves)."""
    directory.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        write_bilm_dir(bilm, directory / MODEL_DIR)
        torch.save(
            {"optimizer": optimizer.state_dict(), "shared": asdict(shared)},
            directory / TRAINER_FILE,
        )
    lstm = None
    if rank_state.lstm_state is not None:
        lstm = [tuple(t.detach().cpu() for t in state) for state in rank_state.lstm_state]
    torch.save(
        {
            "rng": rank_state.rng,
            "forward_stream": _tensors_for_arrays(rank_state.forward_stream),
            "backward_stream": _tensors_for_arrays(rank_state.backward_stream),
            "lstm_state": lstm,
        },
        directory / rank_file(rank),
    )
    return directory


def read_checkpoint(
    directory: Path, rank: int, world_size: int, device: torch.device
) -> LoadedCheckpoint:
    """This rank's view of a checkpoint; its ``rank`` part is None if the world size changed."""
    trainer = torch.load(directory / TRAINER_FILE, map_location=device, weights_only=True)
    shared = SharedState(**trainer["shared"])
    shared.curves = {
        name: [(int(step), float(value)) for step, value in points]
        for name, points in shared.curves.items()
    }
    rank_state = None
    path = directory / rank_file(rank)
    if shared.world_size == world_size:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        lstm = None
        if saved["lstm_state"] is not None:
            forward, backward = (
                LSTMState(h.to(device), c.to(device)) for h, c in saved["lstm_state"]
            )
            lstm = (forward, backward)
        rank_state = RankState(
            saved["rng"], saved["forward_stream"], saved["backward_stream"], lstm
        )
    return LoadedCheckpoint(directory / MODEL_DIR, trainer["optimizer"], shared, rank_state)


def rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def _tensors_for_arrays(value: Any) -> Any:
    """Stream states hold NumPy arrays; as tensors they load with ``weights_only=True``."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {key: _tensors_for_arrays(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_tensors_for_arrays(item) for item in value)
    return value


def capture_rng() -> dict[str, Any]:
    """torch, NumPy and Python RNG states (dropout draws from torch's; candidates travel with the
    stream state)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            position,
            has_gauss,
            cached,
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- where a run keeps them ----------------------------------------------------------------------


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
