"""One data-parallel rank of biLM pretraining, with bilm-tf's recipe
(docs/architecture.md, "Loss and optimisation").

:func:`train_loop_per_worker` runs :func:`train_loop` with :class:`RayRuntime`, which holds every
Ray touch point (marked ``# [ray]``); :class:`LocalRuntime` runs the same loop in one process, as
the unit tests do. Resuming on another number of workers keeps the weights and the optimiser but
deals the streams afresh, with zero LSTM states.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.data.batching import TokenStream
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.errors import ElmoError
from elmo_core.model.bilm import BiLMState, LossOutput
from elmo_core.model.serialization import read_bilm_dir
from elmo_core.model.warm_start import dataset_warmup
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from elmo_core.threads import threads_under_load
from elmo_core.training.batches import StepBatches, StreamPosition, StreamSpec
from elmo_core.training.gradient_exchange import dense_gradient_bytes, ring_bytes
from elmo_core.training.loop import carried_steps, step_batches, training_streams
from elmo_core.training.step import TrainingStep
from pipelines.common.console import show_warnings
from pipelines.serving.bilm_loader import BiLMReference, initial_bilm
from pipelines.train.checkpoint import (
    CheckpointStore,
    RankState,
    SharedState,
    StoredCheckpoint,
    capture_rng,
    read_checkpoint,
    restore_rng,
    write_checkpoint,
)
from pipelines.train.job_config import TrainJobConfig
from pipelines.train.progress import Progress, TrackedRun
from pipelines.train.run_directory import RunDirectory

log = logging.getLogger(__name__)

Metrics = Mapping[str, float | int | bool]
# Ray Train's controller polls its workers this often (seconds; Ray's variable and default).
POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0
# Ray Train logs a worker's exception with its traceback from this logger before the driver sees
# it, and has no public setting to stop that; a user error (ElmoError) reaches the driver's
# terminal as its one line instead. The name is Ray 2.5x's, pinned in constraints.txt.
RAY_TRAIN_ERROR_LOGGER = "ray.train.v2._internal.util"


class WorkerConfig(StrictModel):
    """Everything a worker needs, resolved on the driver (typed at the Ray boundary)."""

    job: TrainJobConfig
    data: str
    run_dir: str
    run_name: str
    total_steps: int = Field(gt=0)
    validation_windows: int = Field(gt=0)
    mlflow_tracking_uri: str
    mlflow_run_id: str
    driver_host: str = Field(default_factory=socket.gethostname)  # built on the driver
    init_from: BiLMReference | None = None  # pinned by the driver (train --init-from)
    resume_step: int | None = Field(
        None, description="the complete checkpoint to resume from, chosen by the driver"
    )
    fail_once: str | None = Field(
        None, description="test hook 'rank:step:marker': that rank kills itself once at that step"
    )
    console: bool = Field(True, description="rank 0 prints its progress lines")


# --- what runs a worker: Ray Train, or this process ----------------------------------------------


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


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry point on each worker: its torch threads (Ray's ``OMP_NUM_THREADS``, the
    worker's CPUs) fewer on a loaded machine (:mod:`elmo_core.threads`), and the warnings of
    every library in the job's log (:func:`show_warnings`)."""
    show_warnings()
    torch.set_num_threads(threads_under_load(torch.get_num_threads()))
    logging.getLogger(RAY_TRAIN_ERROR_LOGGER).addFilter(_drop_user_error_tracebacks)
    train_loop(WorkerConfig.model_validate(config), RayRuntime.current())


def _drop_user_error_tracebacks(record: logging.LogRecord) -> bool:
    """Ray logs inside its ``except`` block, so the exception being handled is the user's."""
    return not isinstance(sys.exc_info()[1], ElmoError)


@dataclass(frozen=True)
class RayRuntime:
    """This Ray Train worker as a :class:`WorkerRuntime`."""

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


# --- the loop ------------------------------------------------------------------------------------


def train_loop(cfg: WorkerConfig, runtime: WorkerRuntime) -> None:
    """Build this rank's worker, resume from the checkpoint the driver chose if any, and train."""
    worker = Worker(cfg, runtime)
    if cfg.resume_step is not None:
        with worker.store.opened(StoredCheckpoint(cfg.resume_step), runtime.rank) as directory:
            worker.restore(directory)
    worker.run()


class Worker:
    """One rank's model, optimiser, streams and loop."""

    def __init__(self, cfg: WorkerConfig, runtime: WorkerRuntime) -> None:
        self.cfg, self.runtime = cfg, runtime
        self.store = CheckpointStore(RunDirectory(cfg.run_dir))
        self.rank, self.world_size, self.device = runtime.rank, runtime.world_size, runtime.device
        self.train = cfg.job.train
        self.manifest = load_manifest(cfg.data)
        word_types = load_word_types(cfg.data, self.manifest)
        self.char_table = word_types.char_ids
        torch.manual_seed(self.train.seed)  # the same initial weights on every rank
        self.bilm = initial_bilm(cfg.job.model, self.manifest.vocab.size, cfg.init_from)
        # trains from the zero state; saved with the sentences its inference starts after
        self.bilm.set_start_state(None, dataset_warmup(cfg.data, self.manifest, word_types))
        self.bilm.to(self.device).train()
        self.training_step = TrainingStep.build(
            self.bilm, self.train, cfg.job.run.grad_exchange, runtime.wrap_model
        )
        self.optimizer = self.training_step.optimizer
        self.shared = SharedState(
            step=0, world_size=self.world_size, mlflow_run_id=cfg.mlflow_run_id
        )
        self.resumed_from = 0
        _seed_rank(self.train.seed, self.rank)
        self.streams = self._streams(_stream_seeds(self.train.seed, 0))
        self.positions: tuple[StreamPosition, StreamPosition] | None = None  # after the last step
        self.lstm_state: BiLMState | None = None
        self.stop_early = False

    def _streams(self, seeds: tuple[int, int]) -> tuple[StreamSpec, StreamSpec]:
        return training_streams(
            self.training_step,
            self.cfg.data,
            self.manifest,
            seeds,
            rank=self.rank,
            world_size=self.world_size,
        )

    def restore(self, directory: Path) -> None:
        """Continue from a checkpoint: weights, optimiser, counters, and this rank's position."""
        loaded = read_checkpoint(directory, self.rank, self.world_size, self.device)
        self.bilm.load_state_dict(read_bilm_dir(loaded.model_dir).state_dict())
        self.optimizer.load_state_dict(loaded.optimizer)
        self.shared = loaded.shared
        self.resumed_from = loaded.shared.step
        if loaded.rank is None:
            log.warning(
                "resuming step %d with %d workers instead of %d: streams are dealt afresh and "
                "LSTM states start from zero; weights and optimiser are kept",
                self.shared.step,
                self.world_size,
                loaded.shared.world_size,
            )
            self.streams = self._streams(_stream_seeds(self.train.seed, self.shared.step))
            self.shared.world_size = self.world_size
            return
        restore_rng(loaded.rank.rng)
        seeds = (
            TokenStream.saved_seed(loaded.rank.forward_stream),
            TokenStream.saved_seed(loaded.rank.backward_stream),
        )
        forward, backward = self._streams(seeds)
        self.streams = (
            forward.starting_at(loaded.rank.forward_stream),
            backward.starting_at(loaded.rank.backward_stream),
        )
        self.lstm_state = loaded.rank.lstm_state

    def run(self) -> None:
        """Steps until the manifest-derived total (or early stopping), checkpointing on the way."""
        run = TrackedRun(
            self.cfg.mlflow_tracking_uri,
            self.cfg.run_name,
            self.cfg.mlflow_run_id,
            self.cfg.run_dir,
            self.cfg.driver_host,
        )
        progress = Progress(
            run,
            self.shared,
            rank=self.rank,
            total_steps=self.cfg.total_steps,
            log_every=self.train.log_every,
            validation_sentences=min(
                self.train.validation_sentences, self.manifest.split("heldout").num_sentences
            ),
            warn_at=(self.train.warn_rise, self.train.warn_parting),
            console=self.cfg.console,
            dense_bytes=ring_bytes("all_reduce", dense_gradient_bytes(self.bilm), self.world_size),
        )
        output = None
        with progress.tracking(), self._batches() as batches:
            steps = carried_steps(
                self.training_step,
                batches,
                self.device,
                self.lstm_state,
                first_step=self.shared.step + 1,
                seed=_rank_seed(self.train.seed, self.rank),
            )
            while self.shared.step < self.cfg.total_steps and not self.stop_early:
                self._maybe_fail()
                batch, result = next(steps)
                self.lstm_state, output = result.state, result.output
                self.positions = (batch.forward.position, batch.backward.position)
                self.shared.step += 1
                step = self.shared.step
                progress.after_step(
                    step, output, result.grad_norm, self.world_size, result.softmax_bytes
                )
                if step % self.train.validate_every == 0 or step == self.cfg.total_steps:
                    self.validate(progress)
                if step % self.train.checkpoint_every == 0 and step < self.cfg.total_steps:
                    self.checkpoint(output)
            self.checkpoint(output, final=True)
            progress.plot()

    def _batches(self) -> StepBatches:
        """The streams' windows, built ahead by the configured processes (default: two on a GPU,
        none on CPU)."""
        workers = self.cfg.job.run.data_workers
        if workers is None:
            workers = 2 if self.device.type == "cuda" else 0
        return step_batches(
            self.training_step,
            self.streams,
            self.manifest,
            self.char_table,
            self.device,
            workers=workers,
        )

    def validate(self, progress: Progress) -> None:
        """Full-softmax perplexity on the fixed heldout sample, each rank on its part."""
        windows = math.ceil(self.cfg.validation_windows / self.world_size)
        sums = evaluate_perplexity(
            self.bilm,
            self.cfg.data,
            "heldout",
            batch_size=self.train.batch_size,
            unroll_steps=self.train.unroll_steps,
            rank=self.rank,
            world_size=self.world_size,
            max_windows=windows,
            device=self.device,
            progress=False,
        )
        sums = _sum_over_ranks(sums, self.device)
        improved = (
            self.shared.best_perplexity is None or sums.perplexity < self.shared.best_perplexity
        )
        if improved:
            self.shared.best_perplexity = sums.perplexity
            self.shared.best_step = self.shared.step
            self.shared.validations_since_best = 0
        else:
            self.shared.validations_since_best += 1
        progress.after_validation(self.shared.step, sums, self.bilm if improved else None)
        patience = self.train.early_stopping_patience
        self.stop_early = patience is not None and self.shared.validations_since_best >= patience

    def checkpoint(self, output: LossOutput | None, *, final: bool = False) -> None:
        """Every rank saves its part and reports; then rank 0 commits the checkpoint."""
        step = self.shared.step
        if step != self.resumed_from:  # else a resumed, finished run: the checkpoint is stored
            self._save_part(step)
        metrics = self._report_metrics(output)
        self.runtime.report(metrics)  # a barrier: every part is saved
        if self.rank == 0:
            keep = self.cfg.job.run.checkpoints_to_keep
            self.store.commit(step, self.world_size, keep, summary={**metrics, "final": final})

    def _save_part(self, step: int) -> None:
        assert self.positions is not None  # a step was taken since the start
        forward, backward = (position.state_dict() for position in self.positions)
        rank_state = RankState(capture_rng(), forward, backward, self.lstm_state)
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(
                Path(directory),
                self.rank,
                bilm=self.bilm,
                optimizer=self.optimizer,
                shared=self.shared,
                rank_state=rank_state,
            )
            self.store.save_part(step, Path(directory))

    def _report_metrics(self, output: LossOutput | None) -> Metrics:
        """What every rank reports with its checkpoint; rank 0's go into its ``COMPLETE`` record,
        where the driver reads the outcome of the run."""
        return {
            "step": self.shared.step,
            "resumed_from_step": self.resumed_from,
            "sampled_loss": float(output.loss.detach()) if output is not None else math.nan,
            "best_perplexity": self.shared.best_perplexity or math.nan,
            "best_step": self.shared.best_step or 0,  # 0: none yet (steps count from 1)
            "stopped_early": self.stop_early,
        }

    def _maybe_fail(self) -> None:
        """Test hook: rank R kills its own process once at step S (proves the restart path).

        It first waits a few of the controller's polling intervals, so the last reported
        checkpoint has been registered, as it has in any run that fails long after it.
        """
        if self.cfg.fail_once is None:
            return
        rank, step, marker = self.cfg.fail_once.split(":", 2)
        if int(rank) == self.rank and int(step) == self.shared.step and not Path(marker).exists():
            Path(marker).touch()
            time.sleep(3 * float(os.environ.get(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S)))
            os.kill(os.getpid(), signal.SIGKILL)


def _rank_seed(seed: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def _seed_rank(seed: int, rank: int) -> None:
    """Dropout (and anything else drawing from the global RNGs) differs by rank, reproducibly."""
    rank_seed = _rank_seed(seed, rank)
    torch.manual_seed(rank_seed)
    np.random.seed(rank_seed)
    random.seed(rank_seed)


def _stream_seeds(seed: int, from_step: int) -> tuple[int, int]:
    """Independent forward and backward shuffles; a re-deal at ``from_step`` gets new ones."""
    forward, backward = np.random.SeedSequence([seed, from_step]).generate_state(2)
    return int(forward), int(backward)


def _sum_over_ranks(sums: PerplexitySums, device: torch.device) -> PerplexitySums:
    if not (dist.is_available() and dist.is_initialized()):
        return sums
    values = torch.tensor(sums.as_list(), dtype=torch.float64, device=device)
    dist.all_reduce(values)
    return PerplexitySums.from_list(values.tolist())
