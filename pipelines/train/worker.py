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
from elmo_core.data.manifest import Manifest, load_manifest
from elmo_core.data.reader import WordTypes, load_word_types
from elmo_core.errors import ElmoError
from elmo_core.model.bilm import BiLM, BiLMState, LossOutput
from elmo_core.model.serialization import read_bilm_dir
from elmo_core.model.warm_start import dataset_warmup
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from elmo_core.threads import threads_under_load
from elmo_core.training.batches import StepBatches, StreamPosition
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
from pipelines.train.job_config import RunConfig, TrainJobConfig
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


# --- one rank's run, as named steps --------------------------------------------------------------


def train_loop(cfg: WorkerConfig, runtime: WorkerRuntime) -> None:
    """One rank's run: its data, its model and step, where it starts (afresh, or at the checkpoint
    the driver chose), its progress and its batches, then its steps."""
    data = RankData.open(cfg.data)
    training_step = build_training_step(cfg.job, data, cfg.init_from, runtime)
    store = CheckpointStore(RunDirectory(cfg.run_dir))
    seed = cfg.job.train.seed
    _seed_rank(seed, runtime.rank)
    if cfg.resume_step is None:
        shared = SharedState(step=0, world_size=runtime.world_size, mlflow_run_id=cfg.mlflow_run_id)
        start = Start(shared, _stream_seeds(seed, 0))
    else:
        start = resume(store, cfg.resume_step, training_step, seed, runtime)
    progress = rank_progress(cfg, runtime, data, training_step.bilm, start.shared)
    batches = rank_batches(cfg.job.run, training_step, data, start, runtime)
    with progress.tracking(), batches:
        RankLoop(cfg, runtime, training_step, data.url, store, start).run(batches, progress)


@dataclass(frozen=True)
class RankData:
    """The prepared dataset a rank trains on: where it is, its manifest and its word types."""

    url: str
    manifest: Manifest
    word_types: WordTypes

    @classmethod
    def open(cls, url: str) -> RankData:
        manifest = load_manifest(url)
        return cls(url, manifest, load_word_types(url, manifest))


def build_training_step(
    job: TrainJobConfig, data: RankData, init_from: BiLMReference | None, runtime: WorkerRuntime
) -> TrainingStep:
    """The biLM (fresh, or ``init_from``'s weights) on this rank's device, with its optimiser."""
    torch.manual_seed(job.train.seed)  # the same initial weights on every rank
    bilm = initial_bilm(job.model, data.manifest.vocab.size, init_from)
    # trains from the zero state; saved with the sentences its inference starts after
    bilm.set_start_state(None, dataset_warmup(data.url, data.manifest, data.word_types))
    bilm.to(runtime.device).train()
    return TrainingStep.build(bilm, job.train, job.run.grad_exchange, runtime.wrap_model)


@dataclass
class Start:
    """Where a rank's steps begin: the counters every rank shares, its streams' shuffles and
    saved positions (None: dealt afresh), and its carried LSTM state."""

    shared: SharedState
    stream_seeds: tuple[int, int]
    stream_positions: tuple[dict[str, Any], dict[str, Any]] | None = None
    lstm_state: BiLMState | None = None


def resume(
    store: CheckpointStore,
    at_step: int,
    training_step: TrainingStep,
    seed: int,
    runtime: WorkerRuntime,
) -> Start:
    """Load a checkpoint's weights and optimiser into ``training_step``; where the rank starts.

    On another number of workers the rank has no saved part: its streams are dealt afresh and its
    LSTM state starts from zero."""
    with store.opened(StoredCheckpoint(at_step), runtime.rank) as directory:
        loaded = read_checkpoint(directory, runtime.rank, runtime.world_size, runtime.device)
        training_step.bilm.load_state_dict(read_bilm_dir(loaded.model_dir).state_dict())
        training_step.optimizer.load_state_dict(loaded.optimizer)
    shared, part = loaded.shared, loaded.rank
    if part is None:
        log.warning(
            "resuming step %d with %d workers instead of %d: streams are dealt afresh and "
            "LSTM states start from zero; weights and optimiser are kept",
            shared.step,
            runtime.world_size,
            shared.world_size,
        )
        shared.world_size = runtime.world_size
        return Start(shared, _stream_seeds(seed, shared.step))
    restore_rng(part.rng)
    seeds = (
        TokenStream.saved_seed(part.forward_stream),
        TokenStream.saved_seed(part.backward_stream),
    )
    return Start(shared, seeds, (part.forward_stream, part.backward_stream), part.lstm_state)


def rank_batches(
    run: RunConfig,
    training_step: TrainingStep,
    data: RankData,
    start: Start,
    runtime: WorkerRuntime,
) -> StepBatches:
    """This rank's forward and backward windows from where ``start`` stands, built ahead by the
    configured processes (default: two on a GPU, none on CPU); a context manager."""
    forward, backward = training_streams(
        training_step,
        data.url,
        data.manifest,
        start.stream_seeds,
        rank=runtime.rank,
        world_size=runtime.world_size,
    )
    if start.stream_positions is not None:
        at_forward, at_backward = start.stream_positions
        forward, backward = forward.starting_at(at_forward), backward.starting_at(at_backward)
    workers = run.data_workers
    if workers is None:
        workers = 2 if runtime.device.type == "cuda" else 0
    return step_batches(
        training_step,
        (forward, backward),
        data.manifest,
        data.word_types.char_ids,
        runtime.device,
        workers=workers,
    )


def rank_progress(
    cfg: WorkerConfig, runtime: WorkerRuntime, data: RankData, bilm: BiLM, shared: SharedState
) -> Progress:
    """Rank 0's account of the run, in the driver's MLflow run; other ranks report nothing."""
    run = TrackedRun(
        cfg.mlflow_tracking_uri, cfg.run_name, cfg.mlflow_run_id, cfg.run_dir, cfg.driver_host
    )
    train = cfg.job.train
    heldout = data.manifest.split("heldout").num_sentences
    dense = dense_gradient_bytes(bilm)
    return Progress(
        run,
        shared,
        rank=runtime.rank,
        total_steps=cfg.total_steps,
        log_every=train.log_every,
        validation_sentences=min(train.validation_sentences, heldout),
        warn_at=(train.warn_rise, train.warn_parting),
        console=cfg.console,
        dense_bytes=ring_bytes("all_reduce", dense, runtime.world_size),
    )


class RankLoop:
    """A rank's steps from its start; what changes as they go (the shared counters, the streams'
    positions, the LSTM state) lives here."""

    def __init__(
        self,
        cfg: WorkerConfig,
        runtime: WorkerRuntime,
        training_step: TrainingStep,
        data_url: str,
        store: CheckpointStore,
        start: Start,
    ) -> None:
        self.cfg, self.runtime, self.data_url, self.store = cfg, runtime, data_url, store
        self.training_step, self.bilm = training_step, training_step.bilm
        self.train = cfg.job.train
        self.shared = start.shared
        self.resumed_from = start.shared.step
        self.lstm_state = start.lstm_state
        self.positions: tuple[StreamPosition, StreamPosition] | None = None  # after the last step
        self.stop_early = False

    def run(self, batches: StepBatches, progress: Progress) -> None:
        """Steps until the manifest-derived total (or early stopping), checkpointing on the way."""
        steps = carried_steps(
            self.training_step,
            batches,
            self.runtime.device,
            self.lstm_state,
            first_step=self.shared.step + 1,
            seed=_rank_seed(self.train.seed, self.runtime.rank),
        )
        output = None
        while self.shared.step < self.cfg.total_steps and not self.stop_early:
            self._maybe_fail()
            batch, result = next(steps)
            self.lstm_state, output = result.state, result.output
            self.positions = (batch.forward.position, batch.backward.position)
            self.shared.step += 1
            step = self.shared.step
            progress.after_step(
                step, output, result.grad_norm, self.runtime.world_size, result.softmax_bytes
            )
            if step % self.train.validate_every == 0 or step == self.cfg.total_steps:
                self.validate(progress)
            if step % self.train.checkpoint_every == 0 and step < self.cfg.total_steps:
                self.checkpoint(output)
        self.checkpoint(output, final=True)
        progress.plot()

    def validate(self, progress: Progress) -> None:
        """Full-softmax perplexity on the fixed heldout sample, each rank on its part."""
        rank, world_size, device = self.runtime.rank, self.runtime.world_size, self.runtime.device
        sums = evaluate_perplexity(
            self.bilm,
            self.data_url,
            "heldout",
            batch_size=self.train.batch_size,
            unroll_steps=self.train.unroll_steps,
            rank=rank,
            world_size=world_size,
            max_windows=math.ceil(self.cfg.validation_windows / world_size),
            device=device,
            progress=False,
        )
        sums = _sum_over_ranks(sums, device)
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
        if self.runtime.rank == 0:
            keep = self.cfg.job.run.checkpoints_to_keep
            world_size = self.runtime.world_size
            self.store.commit(step, world_size, keep, summary={**metrics, "final": final})

    def _save_part(self, step: int) -> None:
        assert self.positions is not None  # a step was taken since the start
        forward, backward = (position.state_dict() for position in self.positions)
        rank_state = RankState(capture_rng(), forward, backward, self.lstm_state)
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(
                Path(directory),
                self.runtime.rank,
                bilm=self.bilm,
                optimizer=self.training_step.optimizer,
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
        if (
            int(rank) == self.runtime.rank
            and int(step) == self.shared.step
            and not Path(marker).exists()
        ):
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
