"""The synthetic training workload the step benchmarks and the GPU suite time.

Zipf-distributed words (so the per-type char CNN sees a realistic number of distinct words), both
streams' windows, and :class:`elmo_core.training.step.TrainingStep` called as a Ray Train worker
calls it; model FLOPs are counted from the config
(docs/architecture.md, "Where a step's time goes").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from elmo_core.config import ModelConfig
from elmo_core.model.char_cnn import TokenTypes, token_types
from elmo_core.model.sampler import LogUniformSampler, SampledCandidates, touched_rows
from elmo_core.model.softmax import SampledSoftmax
from elmo_core.training.batches import ROWS_PER_OCTAVE, bucket, pad_rows, pad_types
from elmo_core.training.step import StepResult, TrainingStep

CANDIDATE_SETS = 16  # distinct sets the timed steps cycle through


def training_flops_per_position(config: ModelConfig) -> float:
    """Model FLOPs of one training position, both directions: 3 × forward (forward + backward)."""
    cnn, lstm = config.char_cnn, config.lstm
    width, filters = cnn.max_chars_per_token, cnn.num_filters
    char_cnn = sum(n * w * cnn.embedding_dim * (width - w + 1) for w, n in cnn.filters)
    char_cnn += 2 * cnn.num_highway * filters**2 + filters * lstm.projection_dim
    recurrent = sum(
        4 * lstm.cell_dim * (2 * lstm.projection_dim) + lstm.cell_dim * lstm.projection_dim
        for _ in range(lstm.num_layers)
    )
    softmax = (config.num_samples + 1) * lstm.projection_dim
    forward_macs = 2 * (char_cnn + recurrent + softmax)  # two streams, one per direction
    return 3 * 2 * forward_macs


def synthetic_windows(
    batch: int,
    window: int,
    vocab: int,
    num_types: int,
    width: int,
    device: torch.device,
    shape_buckets: bool = False,
) -> tuple[dict[str, torch.Tensor], TokenTypes, np.ndarray]:
    """Both streams: Zipf word ids (targets) and the char ids of random lowercase words, the
    windows' distinct token types as a worker's data loader finds them (padded as
    ``train.shape_buckets`` pads them), and the targets ``(2, B, T)`` on the host, where the
    loader finds the softmax rows."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 13, (num_types,), generator=generator)  # (U,)
    letters = torch.randint(98, 124, (num_types, width), generator=generator)  # 'a'.. +1 ids
    slots = torch.arange(width)  # (W,)
    table = torch.where(slots <= lengths.unsqueeze(1), letters, 261)  # pad char, +1 convention
    table[:, 0] = 259  # begin-of-word
    table[torch.arange(num_types), lengths + 1] = 260  # end-of-word
    sampler = LogUniformSampler(vocab)
    windows, type_ids, targets = {}, [], []
    for name in ("forward", "backward"):
        words = sampler.draw(batch * (window + 1), generator).view(batch, window + 1)  # (B, T+1)
        type_ids.append((words[:, :-1] % num_types).numpy())  # (B, T)
        targets.append(words[:, 1:].numpy())  # (B, T)
        windows[f"{name}_inputs"] = table[words[:, :-1] % num_types].to(device)  # (B, T, W)
        windows[f"{name}_targets"] = words[:, 1:].to(device)  # (B, T)
    char_ids, inverse, used = token_types(np.stack(type_ids), table.numpy())
    if shape_buckets:
        padded, used = pad_types(char_ids.numpy(), used, inverse.numel())
        char_ids = torch.from_numpy(padded)
    types = TokenTypes(char_ids.to(device), inverse.to(device), used)
    return windows, types, np.stack(targets)


FoundAhead = tuple[list[SampledCandidates], list[torch.Tensor]]  # candidate sets, softmax rows


def found_ahead(
    softmax: SampledSoftmax, host_targets: np.ndarray, pinned: bool, shape_buckets: bool = False
) -> FoundAhead:
    """What a worker's data loader finds on the host ahead of its steps: the candidate sets and,
    with each pair, the softmax rows the step touches (on the CPU). ``shape_buckets``: the draw
    counts as tensors and every pair's rows padded to one bucket, as the loader makes them."""
    generator = torch.Generator().manual_seed(0)
    drawn = []
    for _ in range(CANDIDATE_SETS):
        ids, num_tries = softmax.sampler.sample_unique(softmax.num_samples, generator)
        tries: int | torch.Tensor = num_tries
        if shape_buckets:  # a number would be a constant of the captured step
            tries = torch.tensor(num_tries).pin_memory() if pinned else torch.tensor(num_tries)
        drawn.append(SampledCandidates(ids.pin_memory() if pinned else ids, tries))
    rows = [
        touched_rows(
            host_targets, drawn[i].ids.numpy(), drawn[(i + 1) % CANDIDATE_SETS].ids.numpy()
        )
        for i in range(CANDIDATE_SETS)
    ]
    if shape_buckets:
        size = bucket(max(len(pair) for pair in rows), softmax.num_classes, ROWS_PER_OCTAVE)
        rows = [pad_rows(pair, size) for pair in rows]
    return drawn, [torch.from_numpy(pair) for pair in rows]


def worker_step(
    step: TrainingStep,
    windows: dict[str, torch.Tensor],
    types: TokenTypes,
    host_targets: np.ndarray,
    ahead: FoundAhead | None = None,
) -> Callable[[], StepResult]:
    """``step`` on ``windows`` as a worker calls it: each state carried into the next call, the
    candidate sets, token types and softmax rows found ahead (by a worker's data loader; here,
    before the timing, or as given: ``ahead``)."""
    device = windows["forward_targets"].device
    if ahead is None:
        assert step.bilm.softmax is not None
        pinned, buckets = device.type == "cuda", step.train.shape_buckets
        ahead = found_ahead(step.bilm.softmax, host_targets, pinned, shape_buckets=buckets)
    drawn, host_rows = ahead
    rows = [row.to(device) for row in host_rows]
    state, calls = None, 0

    def run() -> StepResult:
        nonlocal state, calls
        candidates = (drawn[calls % CANDIDATE_SETS], drawn[(calls + 1) % CANDIDATE_SETS])
        result = step(
            **windows,
            state=state,
            candidates=candidates,
            types=types,
            softmax_rows=rows[calls % CANDIDATE_SETS],
            row_union=step.agree_on_rows(host_rows[calls % CANDIDATE_SETS]),
        )
        state, calls = result.state, calls + 2
        return result

    return run
