"""Linear probes: one classifier per frozen layer, majority baseline, chunked reads, tag ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.analysis.probe import (
    CONVERGED,
    flat_tag_ids,
    layer_accuracies,
    linear_probe,
    standardisation,
)
from elmo_core.errors import DataError
from elmo_core.tasks.activation_cache import CachedActivations
from elmo_core.tasks.dataset import ClassificationExample, TaggingExample, TaskDataset

NUM_LABELS = 3
DIM = 8
SETTINGS = {"epochs": 8, "batch_size": 32, "lr": 1e-2, "min_updates": 0, "max_epochs": 8}
Splits = tuple[CachedActivations, np.ndarray, CachedActivations, np.ndarray]


def synthetic(seed: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Layer 0 is noise; layer 1 is the tag's centre plus noise (linearly separable)."""
    rng = np.random.default_rng(seed)
    tags = rng.integers(0, NUM_LABELS, num_tokens)  # (N,)
    noise = rng.normal(size=(num_tokens, DIM))  # (N, D)
    informative = 3.0 * np.eye(NUM_LABELS, DIM)[tags] + 0.3 * rng.normal(size=(num_tokens, DIM))
    return np.stack([noise, informative], axis=1), tags  # (N, 2, D), (N,)


def memmapped(directory: Path, values: np.ndarray, sentence_length: int = 5) -> CachedActivations:
    """A float16 cache entry on disk, opened memory-mapped as the activation cache opens it."""
    directory.mkdir(parents=True, exist_ok=True)
    array = np.lib.format.open_memmap(directory / "a.npy", "w+", np.float16, values.shape)
    array[:] = values
    array.flush()
    del array
    offsets = np.arange(0, len(values) + 1, sentence_length, dtype=np.int64)  # (S + 1,)
    return CachedActivations(directory, "k", np.load(directory / "a.npy", mmap_mode="r"), offsets)


def in_memory(cache: CachedActivations, layers: list[int] | None = None) -> CachedActivations:
    """The same entry loaded whole as float32 (optionally only some layers)."""
    values = np.array(cache.activations, dtype=np.float32)
    if layers is not None:
        values = values[:, layers]
    return CachedActivations(cache.directory, cache.key, values, cache.offsets)


@pytest.fixture
def splits(tmp_path: Path) -> Splits:
    train_values, train_tags = synthetic(0, 600)
    test_values, test_tags = synthetic(1, 300)
    return (
        memmapped(tmp_path / "train", train_values),
        train_tags,
        memmapped(tmp_path / "test", test_values),
        test_tags,
    )


def test_probe_finds_the_tag_in_the_informative_layer_only(splits: Splits) -> None:
    result = linear_probe(*splits, NUM_LABELS, seed=0, **SETTINGS)
    assert result.test_accuracy[1] >= 0.98
    assert result.train_accuracy[1] >= 0.98
    assert result.test_accuracy[0] < 0.45  # chance is about 1/3
    assert result.best_layer == 1
    assert len(result.history) == SETTINGS["epochs"]
    assert result.num_train_tokens == 600 and result.num_test_tokens == 300


def test_a_small_split_gets_the_epochs_of_the_minimum_number_of_updates(splits: Splits) -> None:
    settings = SETTINGS | {"min_updates": 100}  # 600 tokens in 19 batches: 6 epochs are 114
    result = linear_probe(*splits, NUM_LABELS, seed=0, **settings | {"epochs": 2, "max_epochs": 2})
    assert len(result.history) == 6
    assert len(linear_probe(*splits, NUM_LABELS, seed=0, **settings).history) == 8


def test_the_probe_trains_on_until_its_training_loss_stops_falling(splits: Splits) -> None:
    settings = SETTINGS | {"epochs": 2, "max_epochs": 100}
    result = linear_probe(*splits, NUM_LABELS, seed=0, **settings)
    falls = [
        max(before - after for before, after in zip(*pair, strict=True))
        for pair in zip(result.history, result.history[1:], strict=False)
    ]
    assert 2 < len(result.history) < 100  # past the least, short of the most
    assert falls[-1] < CONVERGED <= max(falls[:-1])  # it stopped once no layer's loss fell


def test_same_seed_gives_identical_probes(splits: Splits) -> None:
    first = linear_probe(*splits, NUM_LABELS, seed=3, **SETTINGS)
    second = linear_probe(*splits, NUM_LABELS, seed=3, **SETTINGS)
    other = linear_probe(*splits, NUM_LABELS, seed=4, **SETTINGS)
    assert first.history == second.history
    assert first.test_accuracy == second.test_accuracy
    assert torch.equal(first.model.weight, second.model.weight)
    assert first.history != other.history  # the seed orders the minibatches


def test_each_layer_is_trained_alone(splits: Splits) -> None:
    train, train_tags, test, test_tags = splits
    both = linear_probe(train, train_tags, test, test_tags, NUM_LABELS, seed=0, **SETTINGS)
    for layer in (0, 1):
        alone = linear_probe(
            in_memory(train, [layer]),
            train_tags,
            in_memory(test, [layer]),
            test_tags,
            NUM_LABELS,
            seed=0,
            **SETTINGS,
        )
        torch.testing.assert_close(alone.model.weight[0], both.model.weight[layer])
        assert alone.test_accuracy[0] == pytest.approx(both.test_accuracy[layer], abs=1 / 300)


def test_chunked_reading_gives_the_whole_arrays_result(splits: Splits) -> None:
    train, train_tags, test, test_tags = splits
    chunked = linear_probe(train, train_tags, test, test_tags, NUM_LABELS, seed=0, chunk_size=7)
    whole = linear_probe(
        in_memory(train),
        train_tags,
        in_memory(test),
        test_tags,
        NUM_LABELS,
        seed=0,
        chunk_size=10**4,
    )
    torch.testing.assert_close(chunked.model.weight, whole.model.weight)
    assert chunked.test_accuracy == whole.test_accuracy
    assert chunked.train_accuracy == whole.train_accuracy


def test_standardisation_in_chunks_matches_numpy_on_the_whole_array(splits: Splits) -> None:
    values = np.array(splits[0].activations, dtype=np.float64)  # (N, L, D)
    mean, scale = standardisation(splits[0].activations, chunk_size=7)
    np.testing.assert_allclose(mean, values.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scale, 1 / values.std(axis=0), rtol=1e-5)


def test_constant_dimension_is_left_unscaled(tmp_path: Path) -> None:
    values = np.ones((10, 1, 2), dtype=np.float32)
    values[:, 0, 1] = np.arange(10)
    _, scale = standardisation(values, chunk_size=3)
    assert scale[0, 0] == 1.0 and scale[0, 1] == pytest.approx(1 / np.arange(10).std())


def test_layer_accuracies_count_correct_tokens_per_layer(splits: Splits) -> None:
    result = linear_probe(*splits, NUM_LABELS, seed=0, **SETTINGS)
    test, test_tags = splits[2], splits[3]
    per_chunk = layer_accuracies(result.model, test.activations, test_tags, chunk_size=1)
    assert per_chunk == result.test_accuracy


def test_majority_baseline_predicts_the_most_frequent_training_tag(tmp_path: Path) -> None:
    train = memmapped(tmp_path / "train", np.zeros((6, 1, 2)), sentence_length=3)
    test = memmapped(tmp_path / "test", np.zeros((4, 1, 2)), sentence_length=2)
    train_tags = np.array([0, 2, 2, 1, 2, 0])  # tag 2 three times
    test_tags = np.array([2, 0, 1, 2])  # two of four are tag 2
    result = linear_probe(train, train_tags, test, test_tags, 3, seed=0, epochs=1)
    assert result.majority_tag == 2
    assert result.majority_accuracy == 0.5


def test_majority_tie_goes_to_the_lowest_id(tmp_path: Path) -> None:
    train = memmapped(tmp_path / "train", np.zeros((4, 1, 2)), sentence_length=2)
    test = memmapped(tmp_path / "test", np.zeros((2, 1, 2)), sentence_length=2)
    result = linear_probe(train, np.array([2, 1, 1, 2]), test, np.array([1, 1]), 3, seed=0)
    assert result.majority_tag == 1 and result.majority_accuracy == 1.0


def test_progress_reports_each_layers_loss_per_epoch(splits: Splits) -> None:
    calls: list[tuple[int, list[float]]] = []
    linear_probe(
        *splits, NUM_LABELS, seed=0, **SETTINGS, progress=lambda e, x: calls.append((e, x))
    )
    assert [epoch for epoch, _ in calls] == list(range(1, SETTINGS["epochs"] + 1))
    assert all(len(losses) == 2 for _, losses in calls)
    assert calls[-1][1][1] < calls[0][1][1] < np.log(NUM_LABELS)  # the informative layer learns


def test_tags_must_align_with_the_cached_tokens(splits: Splits) -> None:
    train, train_tags, test, test_tags = splits
    with pytest.raises(ValueError, match="train"):
        linear_probe(train, train_tags[:-1], test, test_tags, NUM_LABELS, seed=0)
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        linear_probe(train, train_tags, test, test_tags, 2, seed=0)


def test_flat_tag_ids_follow_the_cache_token_order(tmp_path: Path) -> None:
    dataset = TaskDataset(
        tmp_path / "train.conllu",
        [TaggingExample(["a", "dog"], ["DET", "NOUN"]), TaggingExample(["runs"], ["VERB"])],
    )
    label_ids = {tag: i for i, tag in enumerate(dataset.labels())}  # DET 0, NOUN 1, VERB 2
    ids = flat_tag_ids(dataset, label_ids)
    assert ids.tolist() == [0, 1, 2] and ids.dtype == np.int64


def test_flat_tag_ids_name_an_unknown_tag_and_the_file(tmp_path: Path) -> None:
    dataset = TaskDataset(tmp_path / "test.conllu", [TaggingExample(["x"], ["INTJ"])])
    with pytest.raises(DataError, match=r"test\.conllu: tag 'INTJ'"):
        flat_tag_ids(dataset, {"NOUN": 0})


def test_flat_tag_ids_refuse_untagged_examples() -> None:
    with pytest.raises(DataError, match="ClassificationExample"):
        flat_tag_ids([ClassificationExample(["x"], "pos")], {"pos": 0})
