"""Heldout perplexity of a biLM, as bilm-tf's ``test`` computes it
(docs/architecture.md, "Perplexity").

Both directions' streams, state carried between windows, the exact softmax, ``</S>`` and
``<UNK>`` scored, no dropout. Protocol ``"original"`` is bilm-tf's (256 rows, one token per
step); the default ``"batched"`` reads the same streams for the same B, in windows of 20.
Shapes: B rows, T window, W chars per token, P projection, N scored positions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

from elmo_core.data.batching import TokenStream, Window, window_char_ids
from elmo_core.data.manifest import load_manifest
from elmo_core.data.reader import load_word_types, select_shards
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM, BiLMState, DirectionOutput

Protocol = Literal["batched", "original"]
PROTOCOL_SHAPES: dict[str, tuple[int, int]] = {"batched": (128, 20), "original": (256, 1)}


@dataclass(frozen=True)
class PerplexitySums:
    """Summed negative log likelihoods and token counts; add the parts of several ranks."""

    forward_nll: float = 0.0
    backward_nll: float = 0.0
    forward_tokens: int = 0
    backward_tokens: int = 0
    forward_trapped: int = 0  # rows whose state locked up (cells at the clip) in some window
    backward_trapped: int = 0
    num_rows: int = 0

    def __add__(self, other: PerplexitySums) -> PerplexitySums:
        return PerplexitySums(
            *(getattr(self, field.name) + getattr(other, field.name) for field in fields(self))
        )

    def as_list(self) -> list[float]:
        """The sums in field order, as ranks add them up (``PerplexitySums(*values)``)."""
        return [float(getattr(self, field.name)) for field in fields(self)]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> PerplexitySums:
        """:meth:`as_list`'s values back (two sums of NLL, then counts)."""
        forward_nll, backward_nll, *counts = values
        return cls(forward_nll, backward_nll, *(round(count) for count in counts))

    @property
    def num_tokens(self) -> int:
        return self.forward_tokens

    @property
    def forward_perplexity(self) -> float:
        return _exp_mean(self.forward_nll, self.forward_tokens)

    @property
    def backward_perplexity(self) -> float:
        return _exp_mean(self.backward_nll, self.backward_tokens)

    @property
    def perplexity(self) -> float:
        """``exp(mean ½(CE_f + CE_b))``: the geometric mean of the two directions."""
        return math.sqrt(self.forward_perplexity * self.backward_perplexity)


def _exp_mean(nll: float, tokens: int) -> float:
    return math.exp(nll / tokens) if tokens else math.nan


def evaluate_perplexity(
    bilm: BiLM,
    dataset_url: str,
    split: str = "heldout",
    *,
    files: Sequence[str] | None = None,
    batch_size: int | None = None,
    unroll_steps: int | None = None,
    protocol: Protocol = "batched",
    rank: int = 0,
    world_size: int = 1,
    max_windows: int | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
    carry_state: bool = True,
) -> PerplexitySums:
    """This rank's perplexity sums on ``split`` (all of it, or the heldout ``files``).

    ``batch_size``/``unroll_steps`` default to the protocol's (128 × 20 batched, 256 × 1
    original); the original protocol always runs one token per step and stops at the first step
    a row cannot fill, the batched one scores partial windows. Every row starts from the
    zero state, as bilm-tf's test does; ``carry_state=False`` restarts it at every window, which
    measures what starting cold costs. The sums count the rows whose state locked up.
    """
    if bilm.softmax is None:
        raise ConfigError("perplexity needs a BiLM built with vocab_size", key="vocab_size")
    rows, steps = _window_shape(protocol, batch_size, unroll_steps)
    manifest = load_manifest(dataset_url)
    streams = [
        TokenStream(
            dataset_url,
            split,
            batch_size=rows,
            unroll_steps=steps,
            rank=rank,
            world_size=world_size,
            reverse=reverse,
            shuffle=False,
            repeat=False,
            files=files,
            manifest=manifest,
        )
        for reverse in (False, True)
    ]
    char_table = load_word_types(dataset_url, manifest).char_ids
    positions = sum(s.num_tokens + s.num_sentences for s in select_shards(manifest, split, files))
    total = math.ceil(positions / world_size / (rows * steps))
    bar = tqdm(
        total=min(total, max_windows or total),
        desc=f"perplexity {split}",
        unit="window",
        disable=None if progress else True,
    )
    was_training = bilm.training
    bilm.eval()
    try:
        with torch.no_grad():
            windows = _window_pairs(streams, protocol, max_windows)
            return _score_windows(bilm, windows, char_table, rows, carry_state, device, bar)
    finally:
        bar.close()
        bilm.train(was_training)


def _window_shape(
    protocol: Protocol, batch_size: int | None, unroll_steps: int | None
) -> tuple[int, int]:
    """Rows and steps of a window: those asked for, else the protocol's."""
    default_rows, default_steps = PROTOCOL_SHAPES[protocol]
    steps = unroll_steps or default_steps
    if protocol == "original" and steps != 1:
        raise ConfigError("the original protocol runs one token per step", key="unroll_steps")
    return batch_size or default_rows, steps


def _score_windows(
    bilm: BiLM,
    windows: Iterable[tuple[Window, Window]],
    char_table: np.ndarray,
    rows: int,
    carry_state: bool,
    device: str | torch.device,
    bar: tqdm,
) -> PerplexitySums:
    """The sums over the (forward, backward) windows, each row's state carried from its last
    window (or not), and the rows whose state locked up counted."""
    sums = PerplexitySums()
    state: BiLMState | None = None  # (forward, backward), carried per row
    trapped = torch.zeros(2, rows, dtype=torch.bool, device=device)  # (2, B)
    for forward, backward in windows:
        window_sums, state = _window_sums(
            bilm, forward, backward, char_table, state if carry_state else None, device
        )
        trapped |= _saturated_rows(bilm, state)
        sums = sums + window_sums
        bar.update()
        bar.set_postfix(ppl=f"{sums.perplexity:.2f}")
    forward_trapped, backward_trapped = trapped.sum(dim=1).tolist()
    return replace(
        sums,
        forward_trapped=forward_trapped,
        backward_trapped=backward_trapped,
        num_rows=trapped.shape[1],
    )


def _saturated_rows(bilm: BiLM, state: BiLMState) -> torch.Tensor:
    """``(2, B)``: each direction's rows whose cells mostly sit at the clip after this window."""
    clip = bilm.config.lstm.cell_clip
    if clip is None:  # nothing to lock up against
        return torch.zeros(2, state[0].c.shape[1], dtype=torch.bool, device=state[0].c.device)
    return torch.stack([stack.saturated_rows(clip) for stack in state])


def _window_pairs(
    streams: list[TokenStream], protocol: Protocol, max_windows: int | None
) -> Iterator[tuple[Window, Window]]:
    """(forward, backward) windows of the same rows until the split (or ``max_windows``) ends."""
    for _ in range(max_windows) if max_windows is not None else itertools.count():
        forward, backward = streams[0].next_window(), streams[1].next_window()
        if forward is None or backward is None:
            return
        if protocol == "original" and (forward.inputs < 0).any():
            return  # bilm-tf's _get_batch: the first step that cannot be filled ends the test
        yield forward, backward


def _window_sums(
    bilm: BiLM,
    forward: Window,
    backward: Window,
    char_table: np.ndarray,
    state: BiLMState | None,
    device: str | torch.device,
) -> tuple[PerplexitySums, BiLMState]:
    """Exact NLL sums of one window of each stream, by the biLM's own per-direction forward."""
    forward_ids, forward_targets = _window_tensors(forward, char_table, device)
    backward_ids, backward_targets = _window_tensors(backward, char_table, device)
    (forward_nll, forward_count), (backward_nll, backward_count), state = bilm.score_window(
        forward_ids,
        forward_targets,
        backward_ids,
        backward_targets,
        partial(_summed_nll, bilm),
        state,
    )
    return PerplexitySums(forward_nll, backward_nll, forward_count, backward_count), state


def _window_tensors(
    window: Window, char_table: np.ndarray, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A window's char ids ``(B, T, W)`` and targets ``(B, T)`` on ``device``."""
    char_ids = torch.from_numpy(window_char_ids(window.inputs, char_table))  # (B, T, W)
    return char_ids.to(device), torch.from_numpy(window.targets).to(device)


def _summed_nll(bilm: BiLM, output: DirectionOutput, targets: torch.Tensor) -> tuple[float, int]:
    """Summed full-softmax NLL of one direction's scored positions, and their number."""
    assert bilm.softmax is not None
    scored = output.scored(targets)  # (B, T)
    nll = bilm.softmax.nll(output.top[scored], targets[scored])  # (N,)
    return float(nll.double().sum()), int(scored.sum())


def describe_trapped_rows(forward_trapped: int, backward_trapped: int, num_rows: int | None) -> str:
    """Each direction's rows whose state locked up ("" when none did), the zero-state trap that a
    perplexity alone hides, in one wording for training's validation and ``elmo evaluate``;
    ``num_rows``: the rows evaluated side by side, where known."""
    of = f"of {num_rows} " if num_rows else ""
    return "; ".join(
        f"{direction}: {count} {of}rows locked up (cells at the clip)"
        for direction, count in (("forward", forward_trapped), ("backward", backward_trapped))
        if count
    )
