"""The character-CNN token encoder shared by both LSTM directions (bilm-tf ``char_cnn``).

Per token (docs/architecture.md, "Token encoder"): char embedding → convolutions of several
widths → max over positions (before the activation, as in bilm-tf) → highway layers → projection.
Callers mask padding tokens. The convolutions' biases are added after the max:
``max(conv + b) = max(conv) + b`` (rounding is monotone), so the bias meets ``(N, F)`` pooled
values rather than every one of the ``(N, L, F)`` positions, and its gradient sums N rows rather
than N × L.

Shape legend: B rows, T window, W (W' trimmed) chars per token, E char embedding, F filters,
P projection, N tokens (flattened), U unique word types.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elmo_core.config import ModelConfig
from elmo_core.model.highway import Highway

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}


class TokenTypes(NamedTuple):
    """The distinct token types of a batch, found ahead on the CPU (:func:`token_types`), so the
    encoder neither sorts rows nor reads a width back from the device."""

    char_ids: torch.Tensor  # (U, W) each distinct type's char ids once
    inverse: torch.Tensor  # (...) int64: each position's row of ``char_ids``
    used_width: int  # one past the last column any type uses before its tail


def token_types(type_ids: np.ndarray, char_table: np.ndarray) -> TokenTypes:
    """``type_ids (...)`` word-type ids (-1: no token) → their :class:`TokenTypes`."""
    unique, positions = np.unique(type_ids, return_inverse=True)  # (U,), (N,)
    rows = char_table[np.maximum(unique, 0)]  # (U, W)
    rows[unique < 0] = 0  # the padding token
    differs = np.flatnonzero((rows != rows[:, -1:]).any(axis=0))  # columns before every tail
    used_width = int(differs[-1]) + 1 if differs.size else 0  # as _used_width, in NumPy alone
    inverse = torch.from_numpy(positions.reshape(type_ids.shape))
    return TokenTypes(torch.from_numpy(rows), inverse, used_width)


class CharCNN(nn.Module):
    """``forward(char_ids (..., W)) -> (..., P)``: one vector per token from its characters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        cnn = config.char_cnn
        self.config = config
        self.activation = _ACTIVATIONS[cnn.activation]
        self.char_embedding = nn.Embedding(cnn.num_characters, cnn.embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(cnn.embedding_dim, num, kernel_size=width) for width, num in cnn.filters
        )
        self.pool: Callable[[CharCNN, torch.Tensor, int], torch.Tensor] = _POOLS[config.conv_impl]
        self.highway = Highway(cnn.num_filters, cnn.num_highway, config.cpu_highway_bf16)
        self.projection = nn.Linear(cnn.num_filters, config.lstm.projection_dim)
        self.reset_parameters()

    @property
    def output_dim(self) -> int:
        return self.projection.out_features

    @property
    def max_width(self) -> int:
        """The widest filter: how much constant tail :func:`trim_tail` must keep."""
        return max(width for width, _ in self.config.char_cnn.filters)

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation (``bilm/training.py``), padding row 0 kept at zero."""
        cnn = self.config.char_cnn
        nn.init.uniform_(self.char_embedding.weight, -1.0, 1.0)
        with torch.no_grad():
            self.char_embedding.weight[0].zero_()
        for conv, (width, _) in zip(self.convolutions, cnn.filters, strict=True):
            assert isinstance(conv, nn.Conv1d) and conv.bias is not None
            if cnn.activation == "relu":
                nn.init.uniform_(conv.weight, -0.05, 0.05)
            else:
                nn.init.normal_(conv.weight, std=math.sqrt(1.0 / (width * cnn.embedding_dim)))
            nn.init.zeros_(conv.bias)
        self.highway.reset_parameters()
        nn.init.normal_(self.projection.weight, std=math.sqrt(1.0 / cnn.num_filters))
        nn.init.zeros_(self.projection.bias)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        leading = char_ids.shape[:-1]
        flat = char_ids.reshape(-1, char_ids.shape[-1])  # (N, W)
        return self._encode(flat, _used_width(flat)).reshape(*leading, self.output_dim)

    def encode_types(self, char_ids: torch.Tensor, types: TokenTypes | None = None) -> torch.Tensor:
        """Same result as ``forward``, running the network once per unique token in the batch.

        Text repeats word types heavily (a 20×128 window holds far fewer than 2560 types), and the
        encoder depends only on the characters, so encode each distinct row once and gather.
        ``types`` found ahead (the training data loader's) replace the search on the device.
        """
        leading = char_ids.shape[:-1]
        if types is None:
            flat = char_ids.reshape(-1, char_ids.shape[-1])  # (N, W)
            unique, inverse = torch.unique(flat, dim=0, return_inverse=True)  # (U, W), (N,)
            encoded = self._encode(unique, _used_width(unique))  # (U, P)
        else:
            encoded = self._encode(types.char_ids.long(), types.used_width)  # (U, P)
            inverse = types.inverse
        # F.embedding, not ``encoded[inverse]``: their backward sums the same rows, but indexing's
        # sums each row's positions one after another, and a frequent word is thousands of them
        # (2.1 ms of a 1,024-row step on an H200, one call); the embedding's splits each row's run
        return F.embedding(inverse, encoded).reshape(*leading, self.output_dim)  # (..., P)

    def _encode(self, char_ids: torch.Tensor, used_width: int) -> torch.Tensor:
        """``char_ids (N, W)`` whose columns from ``used_width`` on are each row's tail → (N, P)."""
        chars = self.char_embedding(trim_tail(char_ids, self.max_width, used_width))  # (N, W', E)
        pooled = self.pool(self, chars.transpose(1, 2), used_width)  # (N, F)
        return self.projection(self.highway(self.activation(pooled)))  # (N, P)


def pool_per_width(encoder: CharCNN, chars: torch.Tensor, used_width: int) -> torch.Tensor:
    """``chars (N, E, W')`` → each filter's max over its own valid positions, ``(N, F)``.

    ``max`` rather than ``amax``: the same values, and a backward that writes the gradient to one
    position per filter instead of comparing the whole conv output with the max again. They part
    only on ties, which on real text are copies of one window (the tail, a repeated letter): the
    same chars under the same weights, so every parameter's gradient sums the same.
    """
    convolutions = [cast(nn.Conv1d, conv) for conv in encoder.convolutions]
    pooled = torch.cat(
        [_max_over_positions(_convolve(chars, conv.weight)) for conv in convolutions], dim=-1
    )
    return _add_biases(pooled, convolutions)


def pool_padded(encoder: CharCNN, chars: torch.Tensor, used_width: int) -> torch.Tensor:
    """The same ``(N, F)`` as :func:`pool_per_width` by ONE convolution of every filter.

    Each kernel is zero-padded on the right to the widest width w_max and all are stacked, so one
    GEMM runs every width; the Conv1d's stay the parameters (the stacked weight is built here), so
    checkpoints and bilm-tf imports are unchanged. The stacked filter slides over positions 0 to
    ``used_width``: a narrower filter's positions past that are windows of tail only, copies of
    the one at ``used_width``, and no max needs them. Where the trimmed width W' is less than
    ``used_width + w_max`` (a token long enough that the tail was not cut), zero columns are
    appended and a filter's positions past its own last one (W' − w) are masked before the max.
    """
    filters = encoder.config.char_cnn.filters
    convolutions = [cast(nn.Conv1d, conv) for conv in encoder.convolutions]
    weight = torch.cat(  # (F, E, w_max)
        [
            F.pad(conv.weight, (0, encoder.max_width - width))
            for conv, (width, _) in zip(convolutions, filters, strict=True)
        ]
    )
    missing = used_width + encoder.max_width - chars.shape[-1]  # columns past W'
    out = _convolve(F.pad(chars, (0, missing)), weight)  # (N, F, used_width + 1)
    if missing > 0:
        last = torch.tensor(  # (F,) each filter's last own position
            [chars.shape[-1] - width for width, num in filters for _ in range(num)]
        )
        beyond = torch.arange(out.shape[-1]) > last[:, None]  # (F, used_width + 1)
        out = out.masked_fill(beyond.to(out.device), float("-inf"))
    return _add_biases(_max_over_positions(out), convolutions)  # (N, F)


_POOLS = {"per_width": pool_per_width, "padded": pool_padded}


def _add_biases(pooled: torch.Tensor, convolutions: list[nn.Conv1d]) -> torch.Tensor:
    """``pooled (N, F)`` plus every filter's bias, in ``pooled``'s dtype (a convolution under
    autocast adds it in bf16 too)."""
    bias = torch.cat([cast(torch.Tensor, conv.bias) for conv in convolutions])  # (F,)
    return pooled + bias.to(pooled.dtype)


def _convolve(chars: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``conv1d(chars (N, E, W'), weight (F, E, w))`` → ``(N, F, L)``. Where :func:`channels_last`
    says so, a 2-D convolution over channels-last views: the embedding writes ``(N, W', E)``, the
    layout cuDNN's tensor-core kernels take, and NCHW operands cost 54 layout conversions a
    profiled step at 1,024 rows (benchmarks/results/gpu_bf16_backward-2026-11-27.md)."""
    if not channels_last(chars):
        return F.conv1d(chars, weight)
    kernels = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # (F, E, 1, w)
    return F.conv2d(chars.unsqueeze(2), kernels).squeeze(2)  # (N, F, L), F innermost


def _max_over_positions(out: torch.Tensor) -> torch.Tensor:
    """``out (N, F, L)`` → ``(N, F)``, reduced in the layout ``out`` lies in: where the filters
    are innermost, over the middle dimension of that ``(N, L, F)`` storage, so that the backward's
    gradient (zero but at each maximum) comes back channels-last too."""
    if out.stride(1) == 1 and out.shape[-1] > 1:
        return out.transpose(1, 2).max(dim=1).values
    return out.max(dim=-1).values


def channels_last(chars: torch.Tensor) -> bool:
    """Whether :func:`_convolve` runs channels-last: on CUDA. (A test patches it to compare both
    forms on the CPU.)"""
    return chars.is_cuda


def trim_tail(char_ids: torch.Tensor, max_width: int, used_width: int) -> torch.Tensor:
    """``char_ids (N, W)`` cut to ``(N, W')``: the same pooled features for a fraction of the work.

    Past its last real char a token holds one id repeated (the pad char, or 0 for a padding
    token), so every window inside that tail gives the same value. Keeping ``max_width`` columns
    after the longest token keeps every window that touches a real char and at least one tail
    window wherever the full width had one, so each max is unchanged (and so is its gradient: tied
    tail windows have equal inputs). Words are short (a handful of chars of 50), so this roughly
    halves the convolution work on real text.
    """
    return char_ids[:, : min(char_ids.shape[1], used_width + max_width)]  # (N, W')


def _used_width(char_ids: torch.Tensor) -> int:
    """One past the last column some token of ``char_ids (N, W)`` uses before its tail (read
    back from the device where the ids are: :func:`token_types` finds it ahead on the CPU)."""
    differs = (char_ids != char_ids[:, -1:]).any(dim=0)  # (W,): some token not yet in its tail
    columns = torch.arange(1, char_ids.shape[1] + 1, device=char_ids.device)  # (W,)
    return int((differs * columns).max())
