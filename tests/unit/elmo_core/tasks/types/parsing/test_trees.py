"""Maximum spanning trees: the best tree with one word on the root, as brute force finds it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from elmo_core.tasks.types.parsing.trees import max_spanning_tree, tree_score


def _is_tree(heads: tuple[int, ...]) -> bool:
    if sum(head == 0 for head in heads) != 1:
        return False
    for word in range(1, len(heads) + 1):
        seen = set()
        while word:
            if word in seen:
                return False
            seen.add(word)
            word = heads[word - 1]
    return True


def _brute_force(scores: np.ndarray) -> tuple[float, tuple[int, ...]]:
    size = scores.shape[0] - 1
    choices = [[h for h in range(size + 1) if h != d] for d in range(1, size + 1)]
    return max(
        (tree_score(scores, np.array(heads)), heads)
        for heads in itertools.product(*choices)
        if _is_tree(heads)
    )


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_the_tree_is_the_best_one_rooted_tree_brute_force_finds(size: int) -> None:
    rng = np.random.default_rng(size)
    for _ in range(40):
        scores = rng.normal(size=(size + 1, size + 1))
        scores[:, 0] += rng.normal() * 3  # at times the root draws many words: one must win
        heads = max_spanning_tree(scores)
        assert _is_tree(tuple(heads.tolist()))
        best, _ = _brute_force(scores)
        assert tree_score(scores, heads) == pytest.approx(best)


def test_a_cycle_of_best_heads_is_broken_where_it_costs_least() -> None:
    scores = np.full((4, 4), -5.0)
    scores[1, 2] = scores[2, 1] = 10.0  # words 1 and 2 each other's best head
    scores[3, 1] = 8.0
    scores[1, 0], scores[2, 0] = 1.0, 3.0
    assert max_spanning_tree(scores).tolist() == [2, 0, 1]


def test_no_words_no_heads() -> None:
    assert max_spanning_tree(np.zeros((1, 1))).tolist() == []
