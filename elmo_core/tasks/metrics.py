"""Task metrics: CoNLL span F1 (as conlleval computes it), accuracy, and the confusion matrix.

Spans follow conlleval's chunk rules, right for IOB1 and IOB2: a span starts at ``B-X`` or at an
``I-X`` that continues no ``X`` span, and ends before ``O``, any ``B-``, another type, or the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

SpanScheme = Literal["iob1", "iob2"]
Span = tuple[str, int, int]


def tags_to_spans(tags: Sequence[str], scheme: SpanScheme = "iob2") -> set[Span]:
    """The ``(type, start, end)`` entities of one sentence; ``end`` is exclusive (a slice).

    ``scheme`` names the encoding (``iob1`` or ``iob2``); both are read with the same rules
    (module docstring). A tag that is not ``O``, ``B-TYPE`` or ``I-TYPE`` raises ``ValueError``.
    """
    if scheme not in ("iob1", "iob2"):
        raise ValueError(f"span scheme must be 'iob1' or 'iob2', not {scheme!r}")
    spans: set[Span] = set()
    current: str | None = None
    start = 0
    for index, tag in enumerate(tags):
        prefix, kind = _split_tag(tag, index)
        if current is not None and (prefix != "I" or kind != current):
            spans.add((current, start, index))
            current = None
        if prefix == "B" or (prefix == "I" and current is None):
            current, start = kind, index
    if current is not None:
        spans.add((current, start, len(tags)))
    return spans


@dataclass(frozen=True)
class SpanScores:
    """Precision, recall and F1 with the counts they come from (0.0 where a ratio is 0/0): of
    entity spans, or of one label's items (:func:`label_scores`)."""

    precision: float
    recall: float
    f1: float
    num_gold: int
    num_predicted: int
    num_correct: int

    @classmethod
    def from_counts(cls, num_gold: int, num_predicted: int, num_correct: int) -> SpanScores:
        precision = num_correct / num_predicted if num_predicted else 0.0
        recall = num_correct / num_gold if num_gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return cls(precision, recall, f1, num_gold, num_predicted, num_correct)


@dataclass(frozen=True)
class SpanF1Result(SpanScores):
    """Micro-averaged span scores over all types, and the scores of each type."""

    per_type: dict[str, SpanScores] = field(default_factory=dict)

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat ``{name: value}`` for logging: ``f1``, ``precision``, ``recall``, ``f1.PER``..."""
        metrics = {f"{prefix}precision": self.precision, f"{prefix}recall": self.recall}
        metrics[f"{prefix}f1"] = self.f1
        for kind, scores in sorted(self.per_type.items()):
            metrics[f"{prefix}f1.{kind}"] = scores.f1
        return metrics


def span_f1(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], scheme: SpanScheme = "iob2"
) -> SpanF1Result:
    """CoNLL span precision/recall/F1 of ``predicted`` against ``gold`` tag sequences."""
    _check_parallel(gold, predicted)
    gold_counts: Counter[str] = Counter()
    predicted_counts: Counter[str] = Counter()
    correct_counts: Counter[str] = Counter()
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        gold_spans = tags_to_spans(gold_tags, scheme)
        predicted_spans = tags_to_spans(predicted_tags, scheme)
        gold_counts.update(kind for kind, _, _ in gold_spans)
        predicted_counts.update(kind for kind, _, _ in predicted_spans)
        correct_counts.update(kind for kind, _, _ in gold_spans & predicted_spans)
    per_type = {
        kind: SpanScores.from_counts(
            gold_counts[kind], predicted_counts[kind], correct_counts[kind]
        )
        for kind in sorted(gold_counts.keys() | predicted_counts.keys())
    }
    total = SpanScores.from_counts(
        sum(gold_counts.values()), sum(predicted_counts.values()), sum(correct_counts.values())
    )
    return SpanF1Result(**vars(total), per_type=per_type)


def accuracy(gold: Sequence[Any], predicted: Sequence[Any]) -> float:
    """Fraction of equal items: labels (classification) or, for lists of tag lists, tokens."""
    gold_items = _flatten(gold)
    predicted_items = _flatten(predicted)
    if gold_items is not gold:
        _check_parallel(gold, predicted)
    if len(gold_items) != len(predicted_items):
        raise ValueError(f"{len(gold_items)} gold items but {len(predicted_items)} predicted")
    if not gold_items:
        raise ValueError("accuracy of no items is undefined")
    return sum(a == b for a, b in zip(gold_items, predicted_items, strict=True)) / len(gold_items)


def confusion_matrix(
    gold: Sequence[Any], predicted: Sequence[Any], labels: Sequence[str]
) -> np.ndarray:
    """Counts ``(C, C)`` in the order of ``labels``: row = gold label, column = predicted one.

    Items are labels (classification, pairs) or, given lists of tag lists, tokens (flattened as
    :func:`accuracy` does). A label outside ``labels`` raises ``ValueError``.
    """
    gold_items, predicted_items = _flatten(gold), _flatten(predicted)
    if gold_items is not gold:
        _check_parallel(gold, predicted)
    if len(gold_items) != len(predicted_items):
        raise ValueError(f"{len(gold_items)} gold items but {len(predicted_items)} predicted")
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted((set(gold_items) | set(predicted_items)) - index.keys())
    if unknown:
        raise ValueError(f"labels {unknown} are not in {list(labels)}")
    matrix = np.zeros((len(labels), len(labels)), dtype=np.int64)
    rows = np.array([index[item] for item in gold_items], dtype=np.int64)
    columns = np.array([index[item] for item in predicted_items], dtype=np.int64)
    np.add.at(matrix, (rows, columns), 1)
    return matrix


def label_scores(matrix: np.ndarray, labels: Sequence[str]) -> dict[str, SpanScores]:
    """Each label's precision, recall and F1 against all other labels, from a confusion matrix.

    A label neither in the gold data nor predicted is left out: it has no score to report.
    """
    correct = np.diagonal(matrix)
    num_gold, num_predicted = matrix.sum(axis=1), matrix.sum(axis=0)
    return {
        label: SpanScores.from_counts(int(num_gold[i]), int(num_predicted[i]), int(correct[i]))
        for i, label in enumerate(labels)
        if num_gold[i] or num_predicted[i]
    }


def _split_tag(tag: str, index: int) -> tuple[str, str | None]:
    if tag == "O":
        return "O", None
    prefix, dash, kind = tag.partition("-")
    if prefix not in ("B", "I") or not dash or not kind:
        raise ValueError(f"tag {tag!r} at position {index} is not O, B-TYPE or I-TYPE")
    return prefix, kind


def _check_parallel(gold: Sequence[Sequence[Any]], predicted: Sequence[Sequence[Any]]) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for index, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(
                f"sentence {index}: {len(gold_tags)} gold tags but {len(predicted_tags)} predicted"
            )


def _flatten(items: Sequence[Any]) -> Sequence[Any]:
    """Concatenate a sequence of lists/tuples; return any other sequence unchanged."""
    if len(items) and all(isinstance(item, list | tuple) for item in items):
        return [element for item in items for element in item]
    return items
