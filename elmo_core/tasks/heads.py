"""What every task head shares: the BiLSTM encoder over a task's token vectors ``[word
embedding; ELMo]`` (with ``elmo_at_output`` a second ELMo vector joins its output, Peters et al.
2018, §3.3), pooling, and the base class; each task type's own head lives with its type
(:mod:`elmo_core.tasks.types`).
Shapes: B rows, T tokens, I input width, E encoder output width (2·hidden, plus D with ELMo at the
output), H hidden, K labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig


class HeadInput(NamedTuple):
    """One sentence side: ``inputs (B, T, I)``, ``mask (B, T)``, and ELMo for the encoder output."""

    inputs: torch.Tensor
    mask: torch.Tensor
    output_elmo: torch.Tensor | None = None  # (B, T, D) when HeadConfig.elmo_at_output


class SequenceEncoder(nn.Module):
    """A BiLSTM over the real tokens of each row: padding never enters the state.

    On a GPU cuDNN runs the packed rows. A CPU's fast LSTM (oneDNN's, forward and backward) takes
    no packed input, so there each direction runs over the padded rows, the backward one over
    each row's real tokens reversed in place: padding then only ever follows a row's tokens, and
    the outputs at real positions are the packed ones (benchmarks/results/task_lstm-2026-11-29.md).
    """

    def __init__(self, input_dim: int, hidden_dim: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        self.output_dim = 2 * hidden_dim
        self.lstm = nn.LSTM(
            input_dim,
            hidden_dim,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``inputs (B, T, I)``, ``mask (B, T)`` → ``(B, T, 2H)``, zero at padding."""
        encode = self.packed if inputs.is_cuda else self.padded
        outputs = encode(inputs, mask)
        return outputs * mask.unsqueeze(-1).to(outputs.dtype)  # (B, T, 2H)

    def packed(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Both directions at once over the packed rows → ``(B, T, 2H)``, padding unset."""
        lengths = mask.sum(dim=1).clamp(min=1).cpu()  # (B,) an empty row is masked out after
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        outputs, _ = self.lstm(packed)
        padded, _ = pad_packed_sequence(outputs, batch_first=True, total_length=inputs.shape[1])
        return padded

    def padded(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each layer's directions one after the other over the padded rows → ``(B, T, 2H)``,
        padding unset."""
        reversal = _reversal(mask)  # (B, T, 1)
        outputs = inputs
        for layer in range(self.lstm.num_layers):
            if layer:
                outputs = nn.functional.dropout(outputs, self.lstm.dropout, self.training)
            forward = self._direction(outputs, layer, "")
            backward = self._direction(_take(outputs, reversal), layer, "_reverse")
            outputs = torch.cat([forward, _take(backward, reversal)], dim=-1)  # (B, T, 2H)
        return outputs

    def _direction(self, inputs: torch.Tensor, layer: int, suffix: str) -> torch.Tensor:
        """One direction of one layer, left to right over ``inputs (B, T, I)`` → ``(B, T, H)``."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        weights = [getattr(self.lstm, f"{name}_l{layer}{suffix}") for name in names]
        state = inputs.new_zeros(1, inputs.shape[0], self.lstm.hidden_size)
        # what nn.LSTM calls: has_biases, num_layers, dropout, train, bidirectional, batch_first
        run = (True, 1, 0.0, self.training, False, True)
        outputs, _, _ = torch.lstm(inputs, (state, state), weights, *run)
        return outputs


def _reversal(mask: torch.Tensor) -> torch.Tensor:
    """For each position of ``mask (B, T)``: the position holding its row's reversed token, the
    position itself at padding → ``(B, T, 1)`` (its own inverse)."""
    lengths = mask.sum(dim=1, keepdim=True)  # (B, 1)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)  # (B, T)
    return torch.where(mask, lengths - 1 - positions, positions).unsqueeze(-1)


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values (B, T, W)`` reordered along T by ``index (B, T, 1)``."""
    return values.gather(1, index.expand(-1, -1, values.shape[-1]))


def pool(values: torch.Tensor, mask: torch.Tensor, how: Literal["max", "mean"]) -> torch.Tensor:
    """Max or mean of ``values (B, T, E)`` over the real positions of ``mask (B, T)`` → (B, E)."""
    keep = mask.unsqueeze(-1)  # (B, T, 1)
    if how == "max":
        lowest = torch.finfo(values.dtype).min
        pooled = values.masked_fill(~keep, lowest).max(dim=1).values  # (B, E)
        return torch.where(mask.any(dim=1, keepdim=True), pooled, torch.zeros_like(pooled))
    total = (values * keep.to(values.dtype)).sum(dim=1)  # (B, E)
    return total / mask.sum(dim=1, keepdim=True).clamp(min=1).to(values.dtype)


class TaskHead(nn.Module):
    """A head with one encoder; sentence-level heads train by cross-entropy on ``scores (B, K)``."""

    def __init__(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int = 0
    ) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.encoder = SequenceEncoder(
            input_dim, config.hidden_dim, config.num_layers, config.dropout
        )
        self.encoded_dim = self.encoder.output_dim + output_elmo_dim  # E
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, side: HeadInput) -> torch.Tensor:
        """The BiLSTM encoding of one side, with ELMo concatenated when given → (B, T, E)."""
        encoded = self.encoder(side.inputs, side.mask)  # (B, T, 2H)
        if side.output_elmo is not None:
            encoded = torch.cat([encoded, side.output_elmo], dim=-1)  # (B, T, E)
        return encoded

    def loss(self, scores: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of ``scores (B, K)`` against ``targets (B,)``."""
        return nn.functional.cross_entropy(scores, targets)

    def decode(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The predicted label ids → (B,)."""
        return scores.argmax(dim=-1)
