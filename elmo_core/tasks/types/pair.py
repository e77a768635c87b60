"""Sentence pairs: a label for every premise–hypothesis pair (SNLI, MultiNLI), by ESIM (Chen et al.
2017, the paper's SNLI baseline) or a simpler pooled matching."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.tasks.dataset import PairExample, TaskDataset
from elmo_core.tasks.heads import HeadInput, SequenceEncoder, TaskHead, pool
from elmo_core.tasks.snli import read_snli
from elmo_core.tasks.types.base import LABEL, Column, Format, Prediction, TaskType

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig, Split, TaskConfig


PREMISE, HYPOTHESIS = "premise", "hypothesis"


class PairHead(TaskHead):
    """Premise/hypothesis classifier: ESIM, or the simpler pooled matching (``pair_head``).
    Shapes: Ta, Tb the two sides' tokens."""

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


class SnliOptions(StrictModel):
    snli_tokenization: Literal["binary_parse", "whitespace"] = Field(
        "binary_parse", description="binary-parse leaves (whitespace when absent) or split"
    )


def _snli(path: Path, options: SnliOptions, split: Split) -> TaskDataset[PairExample]:
    return read_snli(path, tokenization=options.snli_tokenization)


class Pair(TaskType):
    name = "pair"
    summary = "A label for every premise–hypothesis pair"
    formats = (Format("snli", _snli, SnliOptions),)
    head_options = ("pair_head", "pooling")
    sides = (PREMISE, HYPOTHESIS)

    def options_read(self, task: TaskConfig) -> tuple[str, ...]:
        """ESIM pools both ways itself; only ``match`` reads ``pooling``."""
        return ("pair_head",) if task.head.pair_head == "esim" else self.head_options

    def head(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
    ) -> TaskHead:
        return PairHead(input_dim, num_labels, config, output_elmo_dim)

    def gold(self, example: PairExample) -> str:
        return example.label

    def text_columns(self, example: PairExample) -> dict[str, str]:
        return {PREMISE: " ".join(example.premise), HYPOTHESIS: " ".join(example.hypothesis)}

    def outputs(self) -> tuple[Column, ...]:
        return (Column(LABEL, "string"),)

    def output_rows(
        self, tokens: Sequence[list[str]], predictions: Sequence[Prediction | None]
    ) -> dict[str, list[Any]]:
        return {LABEL: list(predictions)}
