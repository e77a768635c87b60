"""The Ray Train worker: :func:`train_loop_per_worker` is what ``TorchTrainer`` runs on every rank.

It runs :func:`pipelines.train.loop.train_loop` with :class:`RayRuntime`, where every Ray touch
point is (marked ``# [ray]``): the context (rank, world size, device), the model prepared for DDP,
``get_checkpoint`` to resume and ``report`` to checkpoint. Ray Train assembles the ranks' reported
directories into one checkpoint under ``storage_path/name`` and restarts the group from the latest
one after a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
from torch import nn

from pipelines.train.loop import WorkerConfig, train_loop
from pipelines.train.runtime import Metrics


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry point on each worker."""
    train_loop(WorkerConfig.model_validate(config), RayRuntime.current())


@dataclass(frozen=True)
class RayRuntime:
    """This Ray Train worker as a :class:`~pipelines.train.runtime.WorkerRuntime`."""

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def current(cls) -> RayRuntime:
        context = ray.train.get_context()  # [ray]
        device = ray.train.torch.get_device()  # [ray]
        return cls(context.get_world_rank(), context.get_world_size(), device)

    def wrap_model(self, module: nn.Module) -> nn.Module:
        return ray.train.torch.prepare_model(module)  # [ray] device + DDP when world > 1

    @contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        checkpoint = ray.train.get_checkpoint()  # [ray] the latest one after a restart or resume
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as directory:
            yield Path(directory)

    def report(self, metrics: Metrics, checkpoint_dir: Path) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
        ray.train.report(dict(metrics), checkpoint=checkpoint)  # [ray] a barrier on all ranks
