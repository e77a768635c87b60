"""The training loop's core, shared by the Ray worker (``pipelines.train.worker``) and
:func:`elmo_core.training.local_run.step_results`: a rank's two training streams (forward and
backward, shuffled independently, its own part of the shards), their windows built ahead, and
each step's LSTM state carried into the next window of the same rows (truncated BPTT).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from elmo_core.data.manifest import Manifest
from elmo_core.model.bilm import BiLMState
from elmo_core.training.batches import CandidateSpec, StepBatch, StepBatches, StreamSpec
from elmo_core.training.step import StepResult, TrainingStep


def training_streams(
    step: TrainingStep,
    dataset_url: str,
    manifest: Manifest,
    seeds: tuple[int, int],
    *,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[StreamSpec, StreamSpec]:
    """The forward and backward streams of ``rank``, shuffled with ``seeds``, in windows of
    ``step``'s batch size and unroll, with the sampled candidates drawn in the data path."""
    candidates = CandidateSpec(manifest.vocab.size, step.bilm.config.num_samples)
    forward, backward = (
        StreamSpec(
            dataset_url,
            batch_size=step.train.batch_size,
            unroll_steps=step.train.unroll_steps,
            rank=rank,
            world_size=world_size,
            reverse=reverse,
            seed=seed,
            candidates=candidates,
        )
        for reverse, seed in zip((False, True), seeds, strict=True)
    )
    return forward, backward


def step_batches(
    step: TrainingStep,
    streams: tuple[StreamSpec, StreamSpec],
    manifest: Manifest,
    char_table: np.ndarray,
    device: torch.device,
    *,
    workers: int,
) -> StepBatches:
    """The streams' windows from where they stand, built ahead by ``workers`` loader processes
    (0: in this one); a context manager that stops them."""
    return StepBatches(
        streams,
        manifest,
        char_table,
        workers=workers,
        pin_memory=device.type == "cuda",
        shape_buckets=step.train.shape_buckets,
    )


def carried_steps(
    step: TrainingStep,
    batches: Iterable[StepBatch],
    device: torch.device,
    state: BiLMState | None = None,
) -> Iterator[tuple[StepBatch, StepResult]]:
    """``step`` on each batch, starting from ``state``, each result's LSTM state carried into the
    next; yields the batch (its streams' positions after it) with its result."""
    for batch in batches:
        result = step(**batch.step_arguments(device), state=state)
        state = result.state
        yield batch, result
