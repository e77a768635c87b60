"""Task heads: what sits on a task's token vectors ``[word embedding; ELMo]`` (Peters et al. 2018).

A BiLSTM encoder (with ``elmo_at_output`` a second ELMo vector joins its output, §3.3), then a
tagging, classification or pair head (ESIM, Chen et al. 2017, the paper's SNLI baseline).
Shapes: B rows, T tokens (Ta, Tb the two sides of a pair), I input width, E encoder output width
(2·hidden, plus D with ELMo at the output), H hidden, K labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from elmo_core.tasks.crf import CRF
from elmo_core.tasks.task_config import HeadConfig, TaskType


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


class TaggingHead(TaskHead):
    """BiLSTM tagger: per-token scores, softmax or CRF output layer."""

    def __init__(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int = 0
    ) -> None:
        super().__init__(input_dim, num_labels, config, output_elmo_dim)
        self.output = nn.Linear(self.encoded_dim, num_labels)
        self.crf = CRF(num_labels) if config.crf else None

    def forward(self, sides: Sequence[HeadInput]) -> torch.Tensor:
        """One side → per-token tag scores ``(B, T, K)``."""
        (side,) = sides
        return self.output(self.dropout(self.encode(side)))  # (B, T, K)

    def loss(self, scores: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """CRF: mean negative log-likelihood per sentence; else mean cross-entropy per token."""
        if self.crf is not None:
            return -self.crf.log_likelihood(scores, targets, mask).mean()
        return nn.functional.cross_entropy(scores[mask], targets[mask])

    def decode(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Viterbi path (CRF) or per-token argmax → ``(B, T)``, 0 at padding."""
        if self.crf is not None:
            return self.crf.viterbi_decode(scores, mask)
        return scores.argmax(dim=-1) * mask.long()


class ClassificationHead(TaskHead):
    """BiLSTM, max or mean pooling over time, linear layer."""

    def __init__(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int = 0
    ) -> None:
        super().__init__(input_dim, num_labels, config, output_elmo_dim)
        self.output = nn.Linear(self.encoded_dim, num_labels)

    def forward(self, sides: Sequence[HeadInput]) -> torch.Tensor:
        """One side → label scores ``(B, K)``."""
        (side,) = sides
        pooled = pool(self.encode(side), side.mask, self.config.pooling)  # (B, E)
        return self.output(self.dropout(pooled))  # (B, K)


class PairHead(TaskHead):
    """Premise/hypothesis classifier: ESIM, or the simpler pooled matching (``pair_head``)."""

    def __init__(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int = 0
    ) -> None:
        super().__init__(input_dim, num_labels, config, output_elmo_dim)
        hidden = config.hidden_dim
        self.esim = config.pair_head == "esim"
        if self.esim:
            self.projection = nn.Sequential(nn.Linear(4 * self.encoded_dim, hidden), nn.ReLU())
            self.composer = SequenceEncoder(hidden, hidden, 1, 0.0)
            features = 4 * self.composer.output_dim  # max and mean of both sides
        else:
            features = 4 * self.encoded_dim  # [u; v; |u − v|; u ⊙ v]
        self.classifier = nn.Sequential(
            nn.Dropout(config.dropout),
            nn.Linear(features, hidden),
            nn.Tanh(),
            nn.Dropout(config.dropout),
            nn.Linear(hidden, num_labels),
        )

    def forward(self, sides: Sequence[HeadInput]) -> torch.Tensor:
        """Premise and hypothesis → label scores ``(B, K)``."""
        premise, hypothesis = sides
        a = self.encode(premise)  # (B, Ta, E)
        b = self.encode(hypothesis)  # (B, Tb, E)
        if not self.esim:
            u = pool(a, premise.mask, self.config.pooling)  # (B, E)
            v = pool(b, hypothesis.mask, self.config.pooling)  # (B, E)
            return self.classifier(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))
        similarity = a @ b.transpose(1, 2)  # (B, Ta, Tb)
        a_aligned = _masked_softmax(similarity, hypothesis.mask.unsqueeze(1)) @ b  # (B, Ta, E)
        b_aligned = (
            _masked_softmax(similarity.transpose(1, 2), premise.mask.unsqueeze(1)) @ a
        )  # (B, Tb, E)
        a_composed = self._compose(a, a_aligned, premise.mask)  # (B, Ta, 2H)
        b_composed = self._compose(b, b_aligned, hypothesis.mask)  # (B, Tb, 2H)
        pooled = [
            pool(composed, mask, how)
            for composed, mask in ((a_composed, premise.mask), (b_composed, hypothesis.mask))
            for how in ("mean", "max")
        ]  # 4 × (B, 2H)
        return self.classifier(torch.cat(pooled, dim=-1))  # (B, K)

    def _compose(
        self, encoded: torch.Tensor, aligned: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """ESIM's enhancement ``[x; x̃; x − x̃; x ⊙ x̃]``, projection and composition BiLSTM."""
        enhanced = torch.cat(
            [encoded, aligned, encoded - aligned, encoded * aligned], dim=-1
        )  # (B, T, 4E)
        projected = self.dropout(self.projection(enhanced))  # (B, T, H)
        return self.composer(projected, mask)  # (B, T, 2H)


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis restricted to ``mask``; all-masked rows give zeros."""
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask.to(scores.dtype)


HEADS: dict[TaskType, type[TaskHead]] = {
    "tagging": TaggingHead,
    "classification": ClassificationHead,
    "pair": PairHead,
}


def build_head(
    task_type: TaskType, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
) -> TaskHead:
    """The head a task of ``task_type`` uses, over ``input_dim``-wide token vectors."""
    return HEADS[task_type](input_dim, num_labels, config, output_elmo_dim)
