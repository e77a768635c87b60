"""Classification: a label for every sentence (SST, TREC, any TSV), by a BiLSTM pooled over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.tasks.classification import read_label_text, read_tsv
from elmo_core.tasks.dataset import ClassificationExample, TaskDataset
from elmo_core.tasks.heads import HeadInput, TaskHead, pool
from elmo_core.tasks.sst import read_sst
from elmo_core.tasks.types.base import (
    LABEL,
    SENTENCE,
    TOKENS,
    Column,
    Format,
    NoOptions,
    Prediction,
    TaskType,
)

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig, Split


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


class SstOptions(StrictModel):
    sst_phrases: bool = Field(False, description="every subtree is a training example")


class TsvOptions(StrictModel):
    tsv_label_column: Literal["first", "last"] = Field(
        "first", description="'label\\tsentence' (first) or 'sentence\\tlabel' (last)"
    )
    tsv_header: bool = Field(False, description="skip the first line")


def _sst(path: Path, options: SstOptions, split: Split) -> TaskDataset[ClassificationExample]:
    """SST phrase-level examples (``sst_phrases``) train only: dev and test are always whole
    sentences, as SST results are reported."""
    return read_sst(path, phrases=options.sst_phrases and split == "train")


def _label_text(path: Path, options: NoOptions, split: Split) -> TaskDataset[ClassificationExample]:

    return read_label_text(path)


def _tsv(path: Path, options: TsvOptions, split: Split) -> TaskDataset[ClassificationExample]:
    return read_tsv(path, label_column=options.tsv_label_column, header=options.tsv_header)


class Classification(TaskType):
    name = "classification"
    summary = "A label for every sentence"
    formats = (
        Format("sst", _sst, SstOptions),
        Format("label_text", _label_text),
        Format("tsv", _tsv, TsvOptions),
    )
    head_options = ("pooling",)

    def head(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
    ) -> TaskHead:
        return ClassificationHead(input_dim, num_labels, config, output_elmo_dim)

    def gold(self, example: ClassificationExample) -> str:
        return example.label

    def text_columns(self, example: ClassificationExample) -> dict[str, str]:
        return {SENTENCE: " ".join(example.tokens)}

    def outputs(self) -> tuple[Column, ...]:
        return (Column(TOKENS, "strings", "the tokens read"), Column(LABEL, "string"))

    def output_rows(
        self, tokens: Sequence[list[str]], predictions: Sequence[Prediction | None]
    ) -> dict[str, list[Any]]:
        return {TOKENS: list(tokens), LABEL: list(predictions)}
