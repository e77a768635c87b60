"""Task metrics: CoNLL span F1 (as conlleval computes it), accuracy, and the confusion matrix.

Spans follow conlleval's chunk rules, right for IOB1 and IOB2: a span starts at ``B-X`` or at an
``I-X`` that continues no ``X`` span, and ends before ``O``, any ``B-``, another type, or the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    _check_scheme(scheme)
    labels = sorted(set(tags))
    index = {label: i for i, label in enumerate(labels)}
    tagging = TagSpans(labels, first_positions=lambda label: list(tags).index(label))
    ids = np.array([index[tag] for tag in tags], dtype=np.int64)
    kinds, starts, ends = tagging.spans(ids, np.array([0, len(ids)], dtype=np.int64))
    return {(tagging.kinds[k], int(s), int(e)) for k, s, e in zip(kinds, starts, ends, strict=True)}


class TagSpans:
    """Span reading over label ids: each label's entity type and whether it is a ``B-`` tag, parsed
    once, so that a whole split's spans come from array operations, not a loop per token."""

    def __init__(
        self, labels: Sequence[str], first_positions: Callable[[str], int] | None = None
    ) -> None:
        parsed = []
        for label in labels:
            try:
                parsed.append(_split_tag(label))
            except ValueError:
                where = first_positions(label) if first_positions is not None else None
                at = f" at position {where}" if where is not None else ""
                raise ValueError(f"tag {label!r}{at} is not O, B-TYPE or I-TYPE") from None
        self.kinds = sorted({kind for _, kind in parsed if kind is not None})
        kind_ids = {kind: i for i, kind in enumerate(self.kinds)}
        self.label_kind = np.array(
            [-1 if kind is None else kind_ids[kind] for _, kind in parsed], dtype=np.int64
        )  # (K,) -1 for O
        self.label_begins = np.array([prefix == "B" for prefix, _ in parsed], dtype=bool)  # (K,)

    def spans(
        self, ids: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Label ids ``(N,)`` of sentences ``offsets (S + 1,)`` → each span's type id, start and
        exclusive end, as positions in ``ids``."""
        kinds = self.label_kind[ids]  # (N,)
        inside = kinds >= 0
        firsts = np.zeros(len(ids), dtype=bool)
        firsts[offsets[:-1][offsets[:-1] < len(ids)]] = True  # (N,) a sentence's first token
        previous = np.concatenate([[-1], kinds[:-1]])  # (N,)
        opens = inside & (self.label_begins[ids] | firsts | (previous != kinds))  # (N,)
        continues = inside & ~opens  # (N,) same type as the token before, in the same span
        closes = inside & ~np.concatenate([continues[1:], [False]])  # (N,) a span's last token
        starts = np.flatnonzero(opens)
        return kinds[starts], starts, np.flatnonzero(closes) + 1


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
    _check_scheme(scheme)
    _check_parallel(gold, predicted)
    flat_gold = [tag for tags in gold for tag in tags]
    flat_predicted = [tag for tags in predicted for tag in tags]
    labels = sorted(set(flat_gold) | set(flat_predicted))
    index = {label: i for i, label in enumerate(labels)}
    lengths = [len(tags) for tags in gold]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)

    def position(label: str) -> int:
        flat = flat_gold if label in flat_gold else flat_predicted
        at = flat.index(label)
        return at - int(offsets[np.searchsorted(offsets, at, side="right") - 1])

    tagging = TagSpans(labels, first_positions=position)
    return span_f1_ids(
        np.array([index[tag] for tag in flat_gold], dtype=np.int64),
        np.array([index[tag] for tag in flat_predicted], dtype=np.int64),
        offsets,
        tagging,
    )


def span_f1_ids(
    gold: np.ndarray, predicted: np.ndarray, offsets: np.ndarray, tagging: TagSpans
) -> SpanF1Result:
    """:func:`span_f1` over label ids ``(N,)`` of the sentences ``offsets (S + 1,)``: what a
    trainer scores its dev split with every evaluation, with no per-token Python work."""
    if gold.shape != predicted.shape:
        raise ValueError(f"{len(gold)} gold tags but {len(predicted)} predicted")
    num_kinds = len(tagging.kinds)
    keys, counts = [], []
    for ids in (gold, predicted):
        kinds, starts, ends = tagging.spans(ids, offsets)
        keys.append((starts * (len(ids) + 1) + ends) * max(num_kinds, 1) + kinds)  # one per span
        counts.append(np.bincount(kinds, minlength=num_kinds))  # (types,)
    correct = np.intersect1d(keys[0], keys[1], assume_unique=True) % max(num_kinds, 1)
    correct_counts = np.bincount(correct, minlength=num_kinds)
    per_type = {
        kind: SpanScores.from_counts(int(counts[0][i]), int(counts[1][i]), int(correct_counts[i]))
        for i, kind in enumerate(tagging.kinds)
        if counts[0][i] or counts[1][i]
    }
    total = SpanScores.from_counts(int(counts[0].sum()), int(counts[1].sum()), len(correct))
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


def _split_tag(tag: str) -> tuple[str, str | None]:
    if tag == "O":
        return "O", None
    prefix, dash, kind = tag.partition("-")
    if prefix not in ("B", "I") or not dash or not kind:
        raise ValueError(f"tag {tag!r} is not O, B-TYPE or I-TYPE")
    return prefix, kind


def _check_scheme(scheme: str) -> None:
    if scheme not in ("iob1", "iob2"):
        raise ValueError(f"span scheme must be 'iob1' or 'iob2', not {scheme!r}")


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
