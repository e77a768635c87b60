"""Training-set fractions: stratified, nested, seeded, and loud when a label would be empty."""

from __future__ import annotations

from collections import Counter

import pytest

from elmo_core.analysis.sampling import check_fractions, smallest_fraction, subsample
from elmo_core.errors import ConfigError, DataError
from elmo_core.tasks.dataset import ClassificationExample, PairExample, TaggingExample

FRACTIONS = [0.1, 0.2, 0.5, 1.0]


def classification(counts: dict[str, int]) -> list[ClassificationExample]:
    """Examples of each label, interleaved so that labels are not in blocks."""
    labels = [label for label, n in counts.items() for _ in range(n)]
    labels = labels[::2] + labels[1::2]
    return [ClassificationExample([f"w{i}"], label) for i, label in enumerate(labels)]


def tagging(num_sentences: int) -> list[TaggingExample]:
    return [TaggingExample([f"w{i}"], ["NOUN"]) for i in range(num_sentences)]


def label_counts(examples: list[ClassificationExample], indices: list[int]) -> Counter[str]:
    return Counter(examples[i].label for i in indices)


def test_classification_subset_keeps_floor_of_each_label() -> None:
    examples = classification({"pos": 60, "neg": 30, "neutral": 10})
    indices = subsample(examples, 0.25, seed=0)
    assert label_counts(examples, indices) == {"pos": 15, "neg": 7, "neutral": 2}
    assert indices == sorted(indices) and len(set(indices)) == len(indices)


def test_full_fraction_keeps_every_example() -> None:
    examples = classification({"pos": 7, "neg": 3})
    assert subsample(examples, 1.0, seed=5) == list(range(10))


def test_float_products_just_below_an_integer_are_not_floored_away() -> None:
    examples = classification({"pos": 100, "neg": 100})  # 0.29 × 100 is 28.999999999999996
    assert label_counts(examples, subsample(examples, 0.29, seed=0)) == {"pos": 29, "neg": 29}


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_subsets_are_nested_across_fractions(seed: int) -> None:
    examples = classification({"pos": 50, "neg": 30, "neutral": 20})
    subsets = [set(subsample(examples, fraction, seed)) for fraction in FRACTIONS]
    for smaller, larger in zip(subsets, subsets[1:], strict=False):
        assert smaller < larger


def test_tagging_subsets_are_nested_random_sentences() -> None:
    examples = tagging(40)
    subsets = [subsample(examples, fraction, seed=3) for fraction in FRACTIONS]
    assert [len(subset) for subset in subsets] == [4, 8, 20, 40]
    for smaller, larger in zip(subsets, subsets[1:], strict=False):
        assert set(smaller) < set(larger)
    assert subsets[0] != list(range(4))  # a random draw, not the first sentences


def test_same_seed_same_subset_other_seed_other_subset() -> None:
    examples = classification({"pos": 50, "neg": 50})
    assert subsample(examples, 0.2, seed=11) == subsample(examples, 0.2, seed=11)
    assert subsample(examples, 0.2, seed=11) != subsample(examples, 0.2, seed=12)


def test_pairs_are_stratified_by_label() -> None:
    examples = [
        PairExample(["p"], ["h"], label)
        for label in ["entailment"] * 20 + ["neutral"] * 10 + ["contradiction"] * 10
    ]
    indices = subsample(examples, 0.5, seed=0)
    assert Counter(examples[i].label for i in indices) == {
        "entailment": 10,
        "neutral": 5,
        "contradiction": 5,
    }


def test_fraction_that_empties_a_label_names_it_and_the_fraction_that_works() -> None:
    examples = classification({"pos": 90, "neg": 20, "rare": 3})
    with pytest.raises(DataError) as raised:
        subsample(examples, 0.1, seed=0, task_name="sst")
    message = str(raised.value)
    assert "task 'sst'" in message and "fraction 0.1" in message
    assert "label 'rare' (3 of 113 training examples)" in message
    assert "0.334" in message
    assert subsample(examples, 0.334, seed=0)  # the fraction the message suggests works


def test_check_fractions_fails_on_the_smallest_fraction_before_any_work() -> None:
    examples = classification({"pos": 90, "neg": 10})
    check_fractions(examples, [0.1, 0.5, 1.0], "sst")
    with pytest.raises(DataError, match=r"task 'sst': fraction 0\.05 leaves label 'neg'"):
        check_fractions(examples, [1.0, 0.5, 0.05], "sst")


def test_check_fractions_counts_the_other_empty_labels() -> None:
    examples = classification({"pos": 90, "a": 5, "b": 4})
    with pytest.raises(DataError, match=r"label 'b' \(4 of 99 training examples\) \(and 1 more"):
        check_fractions(examples, [0.1], "sst")


def test_tagging_fraction_that_keeps_no_sentence_fails() -> None:
    check_fractions(tagging(10), [0.1], "pos")
    with pytest.raises(DataError, match=r"task 'pos': fraction 0\.05 of 10 .* is 0\.1"):
        check_fractions(tagging(10), [0.05], "pos")


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_fractions_outside_zero_one_are_config_errors(fraction: float) -> None:
    with pytest.raises(ConfigError, match=f"task 'sst': fraction {fraction} is not in"):
        check_fractions(classification({"pos": 5}), [0.5, fraction], "sst")


def test_no_examples_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no training examples"):
        subsample([], 0.5, seed=0, task_name="sst")


@pytest.mark.parametrize("count", [1, 3, 7, 99, 101, 12345])
def test_smallest_fraction_keeps_exactly_one_example(count: int) -> None:
    examples = classification({"only": count})
    assert len(subsample(examples, smallest_fraction(count), seed=0)) == 1
