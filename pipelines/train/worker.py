"""The Ray Train worker: :func:`train_loop_per_worker` is what ``TorchTrainer`` runs on every rank.

It runs :func:`pipelines.train.loop.train_loop` with :class:`RayRuntime`, where every Ray touch
point is (marked ``# [ray]``): the context (rank, world size, device), the model prepared for DDP,
and ``report`` (a barrier on all ranks). Checkpoints go to the run directory, not through Ray
(:mod:`pipelines.train.checkpoint_store`); the driver restarts a failed group from the newest one.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

import ray.train
import ray.train.torch
import torch
from torch import nn

from elmo_core.errors import ElmoError
from elmo_core.threads import threads_under_load
from pipelines.train.loop import WorkerConfig, train_loop
from pipelines.train.runtime import Metrics

# Ray Train logs a worker's exception with its traceback from this logger before the driver sees
# it; a user error (ElmoError) reaches the driver's terminal as its one line instead.
RAY_TRAIN_ERROR_LOGGER = "ray.train.v2._internal.util"


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry point on each worker: its torch threads (Ray's ``OMP_NUM_THREADS``, the
    worker's CPUs) fewer on a loaded machine (:mod:`elmo_core.threads`)."""
    torch.set_num_threads(threads_under_load(torch.get_num_threads()))
    logging.getLogger(RAY_TRAIN_ERROR_LOGGER).addFilter(_drop_user_error_tracebacks)
    train_loop(WorkerConfig.model_validate(config), RayRuntime.current())


def _drop_user_error_tracebacks(record: logging.LogRecord) -> bool:
    """Ray logs inside its ``except`` block, so the exception being handled is the user's."""
    return not isinstance(sys.exc_info()[1], ElmoError)


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

    def report(self, metrics: Metrics) -> None:
        ray.train.report(dict(metrics))  # [ray] a barrier on all ranks
