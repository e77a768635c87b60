"""A nearest-neighbour word-sense probe per biLM layer (Peters et al. 2018, §5.3).

A test word takes the nearest of its lemma's sense centroids (mean training vectors), per layer.
Every test lemma needs training examples: the paper's WordNet fallback is not used.
Shapes: N examples, L layers (LSTM layers + 1), D layer width, S senses of one lemma.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elmo_core.errors import DataError
from elmo_core.tasks.activation_cache import CachedActivations
from elmo_core.tasks.dataset import iter_lines

SENSE_SEPARATOR = "%"
# Similarities this close count as a tie, broken toward the lemma's most frequent sense: the token
# layer gives every occurrence of a word the same vector, so its centroids differ by rounding only.
TIE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SenseExample:
    """One target word in context: ``tokens[index]`` has sense ``sense`` of lemma ``lemma``."""

    tokens: list[str]
    index: int
    sense: str
    lemma: str
    line: int

    @property
    def word(self) -> str:
        return self.tokens[self.index]


@dataclass(frozen=True)
class SenseProbeResult:
    """Per-layer accuracy of the nearest-centroid probe, and the most-frequent-sense baseline.

    ``num_lemmas`` counts the test set's lemmas, ``num_senses`` the training set's senses;
    ``num_unseen_senses`` counts test examples whose sense never occurs in training: no
    centroid can name them, so they are scored wrong by the probe and the baseline alike.
    """

    layer_accuracies: list[float]
    mfs_accuracy: float
    train_accuracies: list[float]  # per layer, each training example against the centroids
    num_train: int
    num_test: int
    num_lemmas: int
    num_senses: int
    num_unseen_senses: int

    @property
    def best_layer(self) -> int:
        return int(np.argmax(self.layer_accuracies))


def read_senses(path: str | Path) -> list[SenseExample]:
    """Read a sense file; a malformed line is a ``DataError``.

    UTF-8, one ``lemma%name<TAB>index<TAB>tokenized sentence`` a line, ``index`` being the target's
    0-based token position (``bank%money<TAB>6<TAB>she opened an account at the bank .``); blank
    and ``#`` lines are skipped.
    """
    examples = [
        _parse_line(text, path, number)
        for number, text in iter_lines(path)
        if text.strip() and not text.startswith("#")
    ]
    if not examples:
        raise DataError("no examples in file", path=path)
    return examples


def _parse_line(text: str, path: str | Path, number: int) -> SenseExample:
    fields = text.split("\t")
    if len(fields) != 3:
        raise DataError(
            f"{len(fields)} tab-separated fields; expected 3 ('sense<TAB>index<TAB>sentence')",
            path=path,
            line=number,
        )
    sense, raw_index, sentence = (field.strip() for field in fields)
    lemma, separator, name = sense.partition(SENSE_SEPARATOR)
    if not separator or not lemma or not name:
        raise DataError(
            f"sense '{sense}' is not 'word{SENSE_SEPARATOR}name' (e.g. 'bank%money')",
            path=path,
            line=number,
        )
    try:
        index = int(raw_index)
    except ValueError:
        raise DataError(
            f"word index '{raw_index}' is not an integer", path=path, line=number
        ) from None
    tokens = sentence.split()
    if not tokens:
        raise DataError("empty sentence", path=path, line=number)
    if not 0 <= index < len(tokens):
        raise DataError(
            f"word index {index} is out of range for a sentence of {len(tokens)} tokens "
            f"(0-based, so 0..{len(tokens) - 1})",
            path=path,
            line=number,
        )
    return SenseExample(tokens=tokens, index=index, sense=sense, lemma=lemma, line=number)


def check_senses(
    train: Sequence[SenseExample],
    test: Sequence[SenseExample],
    test_path: str | Path | None = None,
) -> None:
    """Refuse a test set with lemmas no training example has, before any biLM work.

    Such a word has no centroids to choose from and no most frequent sense; the error lists
    every one with the first line it occurs on. A test *sense* unseen in training is allowed
    (it is scored wrong, see :class:`SenseProbeResult`).
    """
    seen = {example.lemma for example in train}
    first_line: dict[str, int] = {}
    for example in test:
        if example.lemma not in seen:
            first_line.setdefault(example.lemma, example.line)
    if first_line:
        listed = ", ".join(f"'{lemma}' (line {line})" for lemma, line in sorted(first_line.items()))
        raise DataError(f"test lemmas with no training example: {listed}", path=test_path)


def read_sense_splits(
    train_path: str | Path, test_path: str | Path
) -> tuple[list[SenseExample], list[SenseExample]]:
    """Read and check both files: every input error surfaces here, before the biLM runs."""
    train, test = read_senses(train_path), read_senses(test_path)
    check_senses(train, test, test_path)
    return train, test


def sense_sentences(examples: Sequence[SenseExample]) -> list[list[str]]:
    """The sentences for the biLM, one per example in order (what ``target_vectors`` reads)."""
    return [example.tokens for example in examples]


def target_vectors(activations: CachedActivations, examples: Sequence[SenseExample]) -> np.ndarray:
    """Each example's target word in every layer → float32 ``(N, L, D)``.

    ``activations`` must hold :func:`sense_sentences` of ``examples``: sentence ``i`` is
    example ``i``, and its word ``index`` sits at row ``offsets[i] + index``.
    """
    lengths = np.diff(activations.offsets)  # (N,)
    expected = np.array([len(example.tokens) for example in examples], dtype=np.int64)  # (N,)
    if len(lengths) != len(expected) or np.any(lengths != expected):
        raise ValueError("activations do not hold the examples' sentences in order")
    indices = np.array([example.index for example in examples], dtype=np.int64)  # (N,)
    rows = activations.offsets[:-1] + indices  # (N,)
    return np.asarray(activations.activations[rows], dtype=np.float32)  # (N, L, D)


def sense_probe(
    train_vectors: np.ndarray,
    train_senses: Sequence[str],
    test_vectors: np.ndarray,
    test_senses: Sequence[str],
) -> SenseProbeResult:
    """Nearest-centroid sense accuracy per layer, and the most-frequent-sense accuracy.

    Vectors are ``(N, L, D)``; a sense's lemma is the part of its label before ``%``. Nearness
    is cosine similarity, not distance: vector norms differ from layer to layer and from one
    occurrence to another, so a distance would favour whichever centroid has a typical length
    rather than the right direction. Ties go to the lemma's most frequent training sense (then
    the first by name), so a layer that cannot tell senses apart scores the baseline.
    """
    _check_vectors(train_vectors, train_senses, test_vectors, test_senses)
    train_lemmas = np.array([lemma_of(sense) for sense in train_senses])
    test_lemmas = np.array([lemma_of(sense) for sense in test_senses])
    unseen = sorted(set(test_lemmas.tolist()) - set(train_lemmas.tolist()))
    if unseen:
        raise ValueError(f"test lemmas with no training example: {unseen} (see check_senses)")
    train_labels, test_labels = np.array(train_senses), np.array(test_senses)
    train_vectors = np.asarray(train_vectors, dtype=np.float64)  # (N, L, D) means without rounding
    num_layers = train_vectors.shape[1]
    layer_correct = np.zeros(num_layers, dtype=np.int64)  # (L,)
    train_correct = np.zeros(num_layers, dtype=np.int64)  # (L,)
    mfs_correct = 0
    for lemma in sorted(set(test_lemmas.tolist())):
        train_rows, test_rows = train_lemmas == lemma, test_lemmas == lemma
        senses = _senses_by_frequency(train_labels[train_rows])  # (S,) most frequent first
        centroids = np.stack(
            [train_vectors[train_rows][train_labels[train_rows] == s].mean(axis=0) for s in senses]
        )  # (S, L, D)
        choice = _nearest(test_vectors[test_rows], centroids)  # (n, L)
        gold = test_labels[test_rows][:, None]  # (n, 1)
        layer_correct += (np.array(senses)[choice] == gold).sum(axis=0)
        mfs_correct += int((gold == senses[0]).sum())
        fitted = _nearest(train_vectors[train_rows], centroids)  # (m, L)
        train_correct += (np.array(senses)[fitted] == train_labels[train_rows][:, None]).sum(0)
    num_test = len(test_labels)
    num_scored = int(np.isin(train_lemmas, test_lemmas).sum())  # the lemmas the test asks about
    return SenseProbeResult(
        layer_accuracies=(layer_correct / num_test).tolist(),
        mfs_accuracy=mfs_correct / num_test,
        train_accuracies=(train_correct / max(num_scored, 1)).tolist(),
        num_train=len(train_labels),
        num_test=num_test,
        num_lemmas=len(set(test_lemmas.tolist())),
        num_senses=len(set(train_labels.tolist())),
        num_unseen_senses=int(np.isin(test_labels, train_labels, invert=True).sum()),
    )


def lemma_of(sense: str) -> str:
    """``bank%money`` → ``bank``."""
    return sense.partition(SENSE_SEPARATOR)[0]


def _senses_by_frequency(labels: np.ndarray) -> list[str]:
    counts = Counter(labels.tolist())
    return sorted(counts, key=lambda sense: (-counts[sense], sense))


def _nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the most cosine-similar centroid per example and layer; ties → lowest index."""
    unit = _unit(np.asarray(vectors, dtype=np.float64))  # (n, L, D)
    unit_centroids = _unit(centroids)  # (S, L, D)
    similarity = np.einsum("nld,sld->nls", unit, unit_centroids)  # (n, L, S)
    best = similarity.max(axis=2, keepdims=True)  # (n, L, 1)
    return np.argmax(similarity >= best - TIE_TOLERANCE, axis=2)  # (n, L) first of the ties


def _unit(vectors: np.ndarray) -> np.ndarray:
    """Vectors scaled to length 1 along the last axis; a zero vector stays zero (similarity 0)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, np.finfo(np.float64).tiny)


def _check_vectors(
    train_vectors: np.ndarray,
    train_senses: Sequence[str],
    test_vectors: np.ndarray,
    test_senses: Sequence[str],
) -> None:
    for name, vectors, senses in (
        ("train", train_vectors, train_senses),
        ("test", test_vectors, test_senses),
    ):
        if vectors.ndim != 3 or len(vectors) != len(senses) or not len(senses):
            raise ValueError(f"{name} vectors {vectors.shape} for {len(senses)} senses")
    if train_vectors.shape[1:] != test_vectors.shape[1:]:
        raise ValueError(f"train (L, D) {train_vectors.shape[1:]} != test {test_vectors.shape[1:]}")
