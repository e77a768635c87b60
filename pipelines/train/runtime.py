"""What the per-worker training loop needs from whatever runs it: Ray Train, or one local process.

:func:`pipelines.train.loop.train_loop` asks its runtime for this worker's rank, the world size and
the device, has it wrap the model (DDP under Ray), and reports metrics through it after each
checkpoint part is saved: a barrier on all ranks, after which rank 0 commits the checkpoint
(:mod:`pipelines.train.checkpoint_store`). :class:`pipelines.train.worker.RayRuntime` is Ray
Train's (what ``train_loop_per_worker`` uses); :class:`LocalRuntime` runs the same loop in one
process without Ray, on CPU in the unit tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

Metrics = Mapping[str, float | int | bool]


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

    def report(self, metrics: Metrics) -> None:
        """Hand this rank's metrics to the job; returns once every rank has reported."""
        ...


@dataclass
class LocalRuntime:
    """Rank 0 of 1 in this process; ``reported`` keeps this session's metrics."""

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

    def report(self, metrics: Metrics) -> None:
        self.reported.append(dict(metrics))
