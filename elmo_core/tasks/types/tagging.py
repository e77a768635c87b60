"""Tagging: a tag for every token (CoNLL-2003 entities, CoNLL-U parts of speech), by a BiLSTM
tagger with a softmax or CRF output layer; entity tags are scored by span F1 as conlleval does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
from pydantic import Field
from torch import nn

from elmo_core.config import StrictModel
from elmo_core.tasks.conll import read_conll2003, read_conllu
from elmo_core.tasks.crf import CRF
from elmo_core.tasks.dataset import TaggingExample, TaskDataset
from elmo_core.tasks.heads import HeadInput, TaskHead
from elmo_core.tasks.metrics import SpanScheme, TagSpans, span_f1, span_f1_ids
from elmo_core.tasks.types.base import (
    SENTENCE,
    TAGS,
    TOKENS,
    Column,
    ErrorTables,
    Format,
    Prediction,
    TaskType,
    label_table,
    per_label_table,
)

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig, Split, TaskConfig


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


class Conll2003Options(StrictModel):
    tag_scheme: Literal["iob1", "iob2", "none"] = Field(
        "iob1", description="tag encoding (the released English files are iob1)"
    )


class ConlluTagOptions(StrictModel):
    conllu_column: Literal["upos", "xpos"] = Field("upos", description="the tag column")


def _conll2003(path: Path, options: Conll2003Options, split: Split) -> TaskDataset[TaggingExample]:
    return read_conll2003(path, tag_scheme=options.tag_scheme)


def _conllu(path: Path, options: ConlluTagOptions, split: Split) -> TaskDataset[TaggingExample]:
    return read_conllu(path, column=options.conllu_column)


class Tagging(TaskType):
    name = "tagging"
    summary = "A tag for every token"
    formats = (
        Format("conll2003", _conll2003, Conll2003Options),
        Format("conllu", _conllu, ConlluTagOptions),
    )
    head_options = ("crf",)
    probe = True

    def head(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
    ) -> TaskHead:
        return TaggingHead(input_dim, num_labels, config, output_elmo_dim)

    def main_metric(self, task: TaskConfig) -> str:
        """Span ``f1`` for entity tags (CoNLL-2003 read as iob1/iob2), else ``accuracy``."""
        return "f1" if _span_scheme(task) else "accuracy"

    def scores(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: np.ndarray,
        predicted: np.ndarray,
        offsets: np.ndarray,
    ) -> dict[str, float]:
        """Token accuracy; with entity tags also span precision, recall and F1 (per type too)."""
        scores = super().scores(task, labels, gold, predicted, offsets)
        if not _span_scheme(task):
            return scores
        return span_f1_ids(gold, predicted, offsets, TagSpans(labels)).to_metrics() | scores

    def gold(self, example: TaggingExample) -> list[str]:
        return list(example.tags)

    def text_columns(self, example: TaggingExample) -> dict[str, str]:
        return {SENTENCE: " ".join(example.tokens)}

    def outputs(self) -> tuple[Column, ...]:
        return (
            Column(TOKENS, "strings", "the tokens read"),
            Column(TAGS, "strings", "one per token"),
        )

    def output_rows(
        self, tokens: Sequence[list[str]], predictions: Sequence[Prediction | None]
    ) -> dict[str, list[Any]]:
        return {TOKENS: list(tokens), TAGS: list(predictions)}

    def no_prediction(self) -> list[str]:
        return []

    def error_tables(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: Sequence[Prediction],
        predicted: Sequence[Prediction],
    ) -> ErrorTables:
        """Precision, recall, F1 and counts per entity type (entity tags) or per tag."""
        scheme = _span_scheme(task)
        if scheme:
            spans = span_f1(
                [list(tags) for tags in gold], [list(tags) for tags in predicted], scheme
            )
            return ErrorTables(per_type=per_label_table(spans.per_type))
        return ErrorTables(per_type=label_table(gold, predicted, labels))


def _span_scheme(task: TaskConfig) -> SpanScheme | None:
    """How the task's entity tags encode spans; None where its tags are no entities."""
    if task.format != "conll2003":
        return None
    scheme = cast(Conll2003Options, task.reader).tag_scheme
    return None if scheme == "none" else scheme
