"""The demo's per-layer distance between one word's vectors in two sentences."""

from __future__ import annotations

import pytest

from pipelines.demo import layer_distances


def test_the_same_vector_in_both_sentences_is_at_distance_zero() -> None:
    token_layer = [0.3, -1.2, 0.7, 2.5]

    assert layer_distances([token_layer], [token_layer]) == pytest.approx([0.0], abs=1e-12)


def test_each_layer_is_one_minus_the_cosine_of_its_two_vectors() -> None:
    first = [[1.0, 0.0], [3.0, 4.0], [1.0, 0.0]]  # (L=3, D=2)
    second = [[1.0, 0.0], [4.0, 3.0], [0.0, 2.0]]

    # cos: 1; (12 + 12) / (5 · 5) = 0.96; 0
    assert layer_distances(first, second) == pytest.approx([0.0, 0.04, 1.0])


def test_length_does_not_count_and_opposite_vectors_are_at_distance_two() -> None:
    first = [[1.0, 2.0], [1.0, 2.0]]
    second = [[10.0, 20.0], [-0.5, -1.0]]

    assert layer_distances(first, second) == pytest.approx([0.0, 2.0], abs=1e-12)
