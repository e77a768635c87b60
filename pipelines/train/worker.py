"""The Ray Train worker: one DDP rank of biLM pretraining (bilm-tf's recipe, DESIGN.md §3).

``train_loop_per_worker(config)`` is what :class:`ray.train.torch.TorchTrainer` runs on every
worker. The Ray touch points are marked ``# [ray]``: the context (rank, world size, device), the
model wrapped for DDP, ``get_checkpoint`` to resume and ``report`` to checkpoint.

Each step every rank reads one window from each of its two streams (forward and backward, shuffled
independently; its own part of the shards), carries the detached LSTM states to the next window
(truncated BPTT), takes gradients of ``loss × unroll_steps`` as bilm-tf does, averages them over
the workers — DDP's all-reduce for the dense parameters, the softmax's touched rows through
:mod:`pipelines.train.gradient_exchange` — clips the global norm and applies Adagrad.

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
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import mlflow
import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.data.batching import TokenStream, Window, window_char_ids
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM, BiLMState, LossOutput
from elmo_core.model.serialization import load_bilm
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from pipelines.common.tracking import log_curves, stage_run
from pipelines.train.checkpoints import (
    RankState,
    RunDirectory,
    SharedState,
    capture_rng,
    initial_bilm,
    read_checkpoint,
    restore_rng,
    write_checkpoint,
)
from pipelines.train.config import TrainJobConfig
from pipelines.train.gradient_exchange import (
    SOFTMAX_PARAMETERS,
    broadcast_parameters,
    clip_global_norm,
    exchange_softmax_gradients,
    exclude_from_ddp,
)

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
    init_from: str | None = None
    init_options: str | None = None
    fail_once: str | None = Field(
        None, description="test hook 'rank:step:marker': that rank kills itself once at that step"
    )


class LossModule(nn.Module):
    """``BiLM.training_loss`` as ``forward``, so DDP's hooks see every call."""

    def __init__(self, bilm: BiLM) -> None:
        super().__init__()
        self.bilm = bilm

    def forward(
        self,
        forward_inputs: torch.Tensor,
        forward_targets: torch.Tensor,
        backward_inputs: torch.Tensor,
        backward_targets: torch.Tensor,
        state: BiLMState | None,
    ) -> tuple[LossOutput, BiLMState]:
        return self.bilm.training_loss(
            forward_inputs, forward_targets, backward_inputs, backward_targets, state
        )


def train_loop_per_worker(config: dict) -> None:
    """Ray Train's entry point on each worker."""
    cfg = WorkerConfig.model_validate(config)
    context = ray.train.get_context()  # [ray]
    worker = Worker(cfg, context.get_world_rank(), context.get_world_size())
    checkpoint = ray.train.get_checkpoint()  # [ray] the latest one after a restart or resume
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            worker.restore(Path(directory))
    worker.run()


class Worker:
    """One rank's model, optimiser, streams and loop."""

    def __init__(self, cfg: WorkerConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.train = cfg.job.train
        self.device = ray.train.torch.get_device()  # [ray]
        self.manifest = load_manifest(cfg.data)
        self.char_table = load_word_types(cfg.data, self.manifest).char_ids
        vocab_size = self.manifest.vocab.size
        torch.manual_seed(self.train.seed)  # the same initial weights on every rank
        self.bilm = initial_bilm(cfg.job.model, vocab_size, cfg.init_from, cfg.init_options)
        assert self.bilm.softmax is not None
        self.bilm.softmax.sparse = cfg.job.run.grad_exchange == "sparse"
        self.bilm.to(self.device).train()
        module = LossModule(self.bilm)
        exclude_from_ddp(module, [f"bilm.{name}" for name in SOFTMAX_PARAMETERS])
        self.module = ray.train.torch.prepare_model(module)  # [ray] device + DDP when world > 1
        broadcast_parameters(self.bilm.softmax.parameters())  # what DDP does for the others
        self.optimizer = torch.optim.Adagrad(
            self.bilm.parameters(),
            lr=self.train.lr,
            initial_accumulator_value=self.train.initial_accumulator,
        )
        self.shared = SharedState(step=0, world_size=world_size, mlflow_run_id=cfg.mlflow_run_id)
        self.resumed_from = 0
        _seed_rank(self.train.seed, rank)
        self.streams = self._streams(_stream_seeds(self.train.seed, 0))
        self.lstm_state: BiLMState | None = None
        self.stop_early = False

    def _streams(self, seeds: tuple[int, int]) -> tuple[TokenStream, TokenStream]:
        forward, backward = (
            TokenStream(
                self.cfg.data,
                "train",
                batch_size=self.train.batch_size,
                unroll_steps=self.train.unroll_steps,
                rank=self.rank,
                world_size=self.world_size,
                reverse=reverse,
                seed=seed,
                manifest=self.manifest,
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
            self.streams = self._streams(_stream_seeds(self.train.seed, self.shared.step))
            self.shared.world_size = self.world_size
            return
        restore_rng(loaded.rank.rng)
        seeds = (
            loaded.rank.forward_stream["identity"]["seed"],
            loaded.rank.backward_stream["identity"]["seed"],
        )
        self.streams = self._streams(seeds)
        self.streams[0].load_state_dict(loaded.rank.forward_stream)
        self.streams[1].load_state_dict(loaded.rank.backward_stream)
        self.lstm_state = loaded.rank.lstm_state

    def run(self) -> None:
        """Steps until the manifest-derived total (or early stopping), checkpointing on the way."""
        progress = Progress(self.cfg, self.rank, self.shared, start_step=self.shared.step)
        with progress.tracking():
            while self.shared.step < self.cfg.total_steps and not self.stop_early:
                self._maybe_fail()
                output, grad_norm = self.step()
                self.shared.step += 1
                step = self.shared.step
                progress.after_step(step, output, grad_norm, self.train.lr, self.world_size)
                if step % self.train.validate_every == 0 or step == self.cfg.total_steps:
                    self.validate(progress)
                if step % self.train.checkpoint_every == 0 and step < self.cfg.total_steps:
                    self.checkpoint(progress, output)
            self.checkpoint(progress, output if self.shared.step > self.resumed_from else None)
            progress.plot()

    def step(self) -> tuple[LossOutput, float]:
        """One optimiser step on the next window of both streams."""
        forward, backward = (stream.next_window() for stream in self.streams)
        assert forward is not None and backward is not None  # repeat=True streams never end
        autocast = self.device.type == "cuda" and self.train.bf16
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            output, state = self.module(
                *self._tensors(forward), *self._tensors(backward), state=self.lstm_state
            )
        self.lstm_state = (state[0].detach(), state[1].detach())  # truncated BPTT
        (output.loss * self.train.unroll_steps).backward()  # bilm-tf scales by the unroll length
        assert self.bilm.softmax is not None
        exchange_softmax_gradients(
            self.bilm.softmax.weight, self.bilm.softmax.bias, self.cfg.job.run.grad_exchange
        )
        grad_norm = clip_global_norm(self.bilm.parameters(), self.train.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return output, grad_norm

    def _tensors(self, window: Window) -> tuple[torch.Tensor, torch.Tensor]:
        char_ids = torch.from_numpy(window_char_ids(window.inputs, self.char_table))  # (B, T, W)
        targets = torch.from_numpy(window.targets)  # (B, T)
        return char_ids.to(self.device), targets.to(self.device)

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

    def checkpoint(self, progress: Progress, output: LossOutput | None) -> None:
        """Every rank writes its part and reports it; Ray Train merges them into one checkpoint."""
        rank_state = RankState(
            capture_rng(),
            self.streams[0].state_dict(),
            self.streams[1].state_dict(),
            self.lstm_state,
        )
        metrics = progress.report_metrics(self.shared, output, self.resumed_from, self.stop_early)
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(
                Path(directory),
                self.rank,
                bilm=self.bilm,
                optimizer=self.optimizer,
                shared=self.shared,
                rank_state=rank_state,
            )
            checkpoint = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=checkpoint)  # [ray] a barrier on all ranks

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
    """Dropout and candidate sampling draw differently on each rank, reproducibly."""
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


class Progress:
    """Rank 0's reporting: a console line, MLflow metrics and curve figures; silent elsewhere."""

    def __init__(self, cfg: WorkerConfig, rank: int, shared: SharedState, start_step: int) -> None:
        self.cfg, self.shared, self.active = cfg, shared, rank == 0
        self.total = cfg.total_steps
        self._start_step, self._started = start_step, time.perf_counter()
        self._reset_window(start_step)

    def _reset_window(self, step: int) -> None:
        self._window_step, self._window_started = step, time.perf_counter()
        self._sums: list[torch.Tensor] = []  # per step: (loss, forward, backward, tokens)

    @contextmanager
    def tracking(self) -> Iterator[None]:
        """Rank 0 resumes the run's MLflow run (created by the driver) for the whole loop."""
        if not self.active:
            with nullcontext():
                yield
            return
        os.environ["MLFLOW_TRACKING_URI"] = self.cfg.mlflow_tracking_uri
        _enable_system_metrics()
        with stage_run("train", run_name=self.cfg.run_name, run_id=self.cfg.mlflow_run_id):
            yield

    def after_step(
        self, step: int, output: LossOutput, grad_norm: float, lr: float, world_size: int
    ) -> None:
        if not self.active:
            return
        parts = (output.loss, output.forward, output.backward, output.num_tokens)
        self._sums.append(torch.stack([part.detach().float() for part in parts]))
        if step % self.cfg.job.train.log_every and step != self.total:
            return
        loss, forward, backward, tokens = torch.stack(self._sums).sum(0).tolist()
        num_steps = len(self._sums)
        elapsed = time.perf_counter() - self._window_started
        tokens_per_s = tokens * world_size / max(elapsed, 1e-9)
        metrics = {
            "train/sampled_loss": loss / num_steps,
            "train/sampled_loss_forward": forward / num_steps,
            "train/sampled_loss_backward": backward / num_steps,
            "tokens_per_s": tokens_per_s,
            "lr": lr,
            "grad_norm": grad_norm,
        }
        mlflow.log_metrics(metrics, step=step)
        self.shared.curves.setdefault("train/sampled_loss", []).append((step, loss / num_steps))
        rate = (step - self._start_step) / max(time.perf_counter() - self._started, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else math.inf
        print(
            f"[train] step {step}/{self.total}  sampled loss {loss / num_steps:.3f}  "
            f"{tokens_per_s:,.0f} tokens/s  grad norm {grad_norm:.2f}  ETA {_duration(eta)}",
            flush=True,
        )
        self._reset_window(step)

    def after_validation(self, step: int, sums: PerplexitySums, best: BiLM | None) -> None:
        """Log the validation perplexities; keep the model as ``best/`` when it improved."""
        if not self.active:
            return
        values = {
            "val/perplexity": sums.perplexity,
            "val/perplexity_forward": sums.forward_perplexity,
            "val/perplexity_backward": sums.backward_perplexity,
        }
        mlflow.log_metrics(values, step=step)
        for name, value in values.items():
            self.shared.curves.setdefault(name, []).append((step, value))
        if best is not None:
            RunDirectory(self.cfg.run_dir).put_model(best, "best")
            mlflow.log_metric("val/best_perplexity", sums.perplexity, step=step)
        print(
            f"[train] step {step}: heldout perplexity {sums.perplexity:.2f} (forward "
            f"{sums.forward_perplexity:.2f}, backward {sums.backward_perplexity:.2f})"
            f"{'  best so far' if best is not None else ''}",
            flush=True,
        )
        self.plot()

    def plot(self) -> None:
        curves = self.shared.curves
        if not self.active:
            return
        log_curves(
            {"sampled loss": curves.get("train/sampled_loss", [])},
            "curves/train_sampled_loss.png",
            ylabel="sampled softmax loss",
            title="training loss (sampled softmax: not comparable to perplexity)",
        )
        log_curves(
            {
                direction: curves.get(f"val/perplexity{suffix}", [])
                for direction, suffix in (
                    ("mean", ""),
                    ("forward", "_forward"),
                    ("backward", "_backward"),
                )
            },
            "curves/val_perplexity.png",
            title="heldout perplexity (full softmax)",
            ylabel="perplexity",
            log_y=True,
        )

    def report_metrics(
        self, shared: SharedState, output: LossOutput | None, resumed_from: int, stopped_early: bool
    ) -> dict[str, float | int | bool]:
        """What every rank passes to ``ray.train.report`` (rank 0's stay with the checkpoint)."""
        return {
            "step": shared.step,
            "resumed_from_step": resumed_from,
            "sampled_loss": float(output.loss.detach()) if output is not None else math.nan,
            "best_perplexity": shared.best_perplexity or math.nan,
            "stopped_early": stopped_early,
        }


def _enable_system_metrics() -> None:
    """CPU/GPU/memory metrics next to the training curves, when psutil is there to read them."""
    try:
        import psutil  # noqa: F401
    except ImportError:
        return
    mlflow.enable_system_metrics_logging()


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
