"""What the per-worker training loop needs from whatever runs it: Ray Train, or one local process.

:func:`pipelines.train.loop.train_loop` asks its runtime for this worker's rank, the world size and
the device, has it wrap the model (DDP under Ray), opens the latest checkpoint to resume from, and
hands it each checkpoint directory with its metrics. :class:`pipelines.train.worker.RayRuntime` is
Ray Train's (what ``train_loop_per_worker`` uses); :class:`LocalRuntime` runs the same loop in one
process without Ray — on CPU in the unit tests — keeping its checkpoints in a directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

Metrics = Mapping[str, float | int | bool]
CHECKPOINT_PREFIX = "checkpoint_"


class WorkerRuntime(Protocol):
    """One rank's view of the job that runs it."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def wrap_model(self, module: nn.Module) -> nn.Module:
        """``module`` on this worker's device, wrapped for data parallelism where there is any."""
        ...

    def latest_checkpoint(self) -> AbstractContextManager[Path | None]:
        """The newest reported checkpoint as a local directory while open; None on a fresh run."""
        ...

    def report(self, metrics: Metrics, checkpoint_dir: Path) -> None:
        """Keep this rank's part of a checkpoint (copied: ``checkpoint_dir`` is temporary)."""
        ...


@dataclass
class LocalRuntime:
    """Rank 0 of 1 in this process: checkpoints go to ``root/checkpoint_NNNNNN`` in report order.

    A new ``LocalRuntime`` on the same ``root`` resumes from the newest one, as a restarted Ray
    Train run does from its storage path; ``reported`` keeps this session's metrics.
    """

    root: Path
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    reported: list[dict[str, float | int | bool]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    def wrap_model(self, module: nn.Module) -> nn.Module:
        return module.to(self.device)

    @contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        checkpoints = self.checkpoints()
        yield checkpoints[-1] if checkpoints else None

    def report(self, metrics: Metrics, checkpoint_dir: Path) -> None:
        name = f"{CHECKPOINT_PREFIX}{len(self.checkpoints()):06d}"
        incoming = self.root / f".{name}"  # renamed into place whole: never a partial checkpoint
        shutil.rmtree(incoming, ignore_errors=True)  # left by a copy that was interrupted
        shutil.copytree(checkpoint_dir, incoming)
        incoming.rename(self.root / name)
        self.reported.append(dict(metrics))

    def checkpoints(self) -> list[Path]:
        """Every checkpoint kept so far, oldest first."""
        return sorted(self.root.glob(f"{CHECKPOINT_PREFIX}*"))
