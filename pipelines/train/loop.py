"""One data-parallel rank of biLM pretraining (bilm-tf's recipe, DESIGN.md §3), runtime-agnostic.

:func:`train_loop` takes what it runs on as a :class:`~pipelines.train.runtime.WorkerRuntime`:
Ray Train's in :func:`pipelines.train.worker.train_loop_per_worker`, a local one in tests.

Each step every rank reads one window from each of its two streams (forward and backward, shuffled
independently; its own part of the shards), carries the detached LSTM states to the next window
(truncated BPTT) and runs :class:`~elmo_core.training.step.TrainingStep`: gradients of ``loss ×
unroll_steps`` as bilm-tf takes them, averaged over the workers (DDP's all-reduce for the dense
parameters, the softmax's touched rows exchanged apart), the global-norm clip and Adagrad.

Resuming with a different number of workers keeps the weights and the optimiser but cannot keep
the data position (each rank's streams cover a different part of the shards): the streams are
dealt afresh with a seed derived from the resumed step, and the LSTM states start from zero. A
warning says so.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from pydantic import Field

from elmo_core.config import StrictModel
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLMState, LossOutput
from elmo_core.model.serialization import load_bilm
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from elmo_core.training.batches import (
    CandidateSpec,
    StepBatch,
    StepBatches,
    StreamPosition,
    StreamSpec,
)
from elmo_core.training.step import TrainingStep
from pipelines.models.bilm_loader import BiLMReference
from pipelines.train.checkpoint_store import CheckpointStore, StoredCheckpoint
from pipelines.train.checkpoints import (
    RankState,
    SharedState,
    capture_rng,
    initial_bilm,
    read_checkpoint,
    restore_rng,
    write_checkpoint,
)
from pipelines.train.config import TrainJobConfig
from pipelines.train.progress import Progress, TrackedRun
from pipelines.train.run_directory import RunDirectory
from pipelines.train.runtime import Metrics, WorkerRuntime

log = logging.getLogger(__name__)

FAULT_DELAY_S = 6.0  # three of Ray Train's 2 s controller polls


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
        self.char_table = load_word_types(cfg.data, self.manifest).char_ids
        vocab_size = self.manifest.vocab.size
        torch.manual_seed(self.train.seed)  # the same initial weights on every rank
        self.bilm = initial_bilm(cfg.job.model, vocab_size, cfg.init_from)
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
        self.streams = self._stream_specs(_stream_seeds(self.train.seed, 0))
        self.positions: tuple[StreamPosition, StreamPosition] | None = None  # after the last step
        self.lstm_state: BiLMState | None = None
        self.stop_early = False

    def _stream_specs(self, seeds: tuple[int, int]) -> tuple[StreamSpec, StreamSpec]:
        forward, backward = (
            StreamSpec(
                self.cfg.data,
                batch_size=self.train.batch_size,
                unroll_steps=self.train.unroll_steps,
                rank=self.rank,
                world_size=self.world_size,
                reverse=reverse,
                seed=seed,
                candidates=CandidateSpec(self.manifest.vocab.size, self.cfg.job.model.num_samples),
            )
            for reverse, seed in zip((False, True), seeds, strict=True)
        )
        return forward, backward

    def restore(self, directory: Path) -> None:
        """Continue from a checkpoint: weights, optimiser, counters, and this rank's position."""
        loaded = read_checkpoint(directory, self.rank, self.world_size, self.device)
        self.bilm.load_state_dict(load_bilm(loaded.model_dir).state_dict())
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
            self.streams = self._stream_specs(_stream_seeds(self.train.seed, self.shared.step))
            self.shared.world_size = self.world_size
            return
        restore_rng(loaded.rank.rng)
        seeds = (
            loaded.rank.forward_stream["identity"]["seed"],
            loaded.rank.backward_stream["identity"]["seed"],
        )
        forward, backward = self._stream_specs(seeds)
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
        )
        with progress.tracking(), self._batches() as batches:
            while self.shared.step < self.cfg.total_steps and not self.stop_early:
                self._maybe_fail()
                output, grad_norm = self.step(next(batches))
                self.shared.step += 1
                step = self.shared.step
                progress.after_step(step, output, grad_norm, self.train.lr, self.world_size)
                if step % self.train.validate_every == 0 or step == self.cfg.total_steps:
                    self.validate(progress)
                if step % self.train.checkpoint_every == 0 and step < self.cfg.total_steps:
                    self.checkpoint(output)
            self.checkpoint(output if self.shared.step > self.resumed_from else None, final=True)
            progress.plot()

    def _batches(self) -> StepBatches:
        """The streams' windows from where they stand, built ahead by the configured processes."""
        workers = self.cfg.job.run.data_workers
        if workers is None:
            workers = 2 if self.device.type == "cuda" else 0
        return StepBatches(
            self.streams,
            self.manifest,
            self.char_table,
            workers=workers,
            pin_memory=self.device.type == "cuda",
            shape_buckets=self.train.shape_buckets,
        )

    def step(self, batch: StepBatch) -> tuple[LossOutput, torch.Tensor]:
        """One optimiser step on the next window of both streams."""
        result = self.training_step(**batch.step_arguments(self.device), state=self.lstm_state)
        self.lstm_state = result.state
        self.positions = (batch.forward.position, batch.backward.position)
        return result.output, result.grad_norm

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
            time.sleep(FAULT_DELAY_S)
            os.kill(os.getpid(), signal.SIGKILL)


def _seed_rank(seed: int, rank: int) -> None:
    """Dropout (and anything else drawing from the global RNGs) differs by rank, reproducibly."""
    rank_seed = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
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
    values = torch.tensor(
        [sums.forward_nll, sums.backward_nll, sums.forward_tokens, sums.backward_tokens],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(values)
    forward_nll, backward_nll, forward_tokens, backward_tokens = values.tolist()
    return PerplexitySums(forward_nll, backward_nll, int(forward_tokens), int(backward_tokens))
