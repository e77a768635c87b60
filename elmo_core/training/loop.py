"""The training loop's core, shared by the Ray worker and :mod:`~elmo_core.training.local_run`.

A rank's two streams (forward and backward, shuffled independently), their windows built ahead,
and each step's LSTM state carried into the next window of the same rows (truncated BPTT).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from elmo_core.data.manifest import Manifest
from elmo_core.model.bilm import BiLMState
from elmo_core.model.lstm.reference import LSTMState
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


class StateReset:
    """Zeroes a ``fraction`` of each direction's rows before a window (``train.state_reset``).

    bilm-tf starts every row from zero once, at step 1, and carries the state forever after, so
    nothing in training penalises what the LSTMs do from zero; yet evaluation and stateless
    inference start every row there, and a forward LSTM can learn a trap it falls into only from
    zero. The rows are drawn on the device from ``(seed, step)`` alone: no host sync, and a run
    resumed at any step draws what the uninterrupted one would.
    """

    def __init__(self, fraction: float, seed: int, device: torch.device) -> None:
        self.fraction, self.seed, self.device = fraction, seed, device
        self.generator = None if fraction == 0 else torch.Generator(device)

    def __call__(self, state: BiLMState | None, step: int) -> BiLMState | None:
        """``state`` before window ``step`` (counted from 1) with the drawn rows zeroed."""
        if self.generator is None or state is None:
            return state
        self.generator.manual_seed(
            int(np.random.SeedSequence([self.seed, step]).generate_state(1)[0])
        )
        num_rows = state[0].h.shape[1]
        draws = torch.rand(2, num_rows, device=self.device, generator=self.generator)  # (2, B)
        keep = (draws >= self.fraction).unsqueeze(-1)  # (2, B, 1): per direction
        return tuple(  # type: ignore[return-value]
            LSTMState(
                stack.h * keep[index].to(stack.h.dtype), stack.c * keep[index].to(stack.c.dtype)
            )
            for index, stack in enumerate(state)
        )


def carried_steps(
    step: TrainingStep,
    batches: Iterable[StepBatch],
    device: torch.device,
    state: BiLMState | None = None,
    *,
    first_step: int = 1,
    seed: int | None = None,
) -> Iterator[tuple[StepBatch, StepResult]]:
    """``step`` on each batch, starting from ``state``, each result's LSTM state carried into the
    next, a ``train.state_reset`` fraction of its rows zeroed (drawn from ``seed``, by default
    ``train.seed``, and the step number, ``first_step`` for the first batch); yields the batch
    (its streams' positions after it) with its result."""
    reset = StateReset(step.train.state_reset, step.train.seed if seed is None else seed, device)
    for number, batch in enumerate(batches, start=first_step):
        union = step.agree_on_rows(batch.softmax_rows)  # on the host, before the step's work
        arguments = batch.step_arguments(device)
        result = step(**arguments, state=reset(state, number), row_union=union)
        state = result.state
        yield batch, result
