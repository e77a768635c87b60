"""ActivationCache: built once, reused, keyed by biLM weights and data, rebuilt when damaged."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.tasks.activation_cache import (
    ACTIVATIONS_FILE,
    META_FILE,
    ActivationCache,
    _publish,
    data_fingerprint,
    flat_positions,
    live_activations,
    pad_ragged,
)

SENTENCES = [
    ["the", "cat", "sat"],
    ["a", "dog"],
    ["birds", "sing", "in", "the", "morning", "light"],
    ["yes"],
    ["the", "dog", "sat", "down"],
]


class CountingBiLM(BiLM):
    """The real biLM, counting its forward calls."""

    calls = 0

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().forward(*args, **kwargs)


@pytest.fixture
def bilm() -> CountingBiLM:
    torch.manual_seed(0)
    return CountingBiLM(tiny())


def test_entry_holds_each_sentences_live_activations(bilm: CountingBiLM, tmp_path: Path) -> None:
    cached = ActivationCache(tmp_path, dtype="float32").get_or_build(bilm, SENTENCES, 2, False)
    assert len(cached) == len(SENTENCES)
    assert cached.activations.shape == (sum(map(len, SENTENCES)), 3, 32)
    for index, tokens in enumerate(SENTENCES):
        live, _ = live_activations(bilm, [tokens])  # (L, 1, T, D)
        stored = cached.activations[cached.offsets[index] : cached.offsets[index + 1]]
        np.testing.assert_allclose(stored, live[:, 0].permute(1, 0, 2).numpy(), atol=1e-5)


def test_batch_pads_with_zeros_and_masks(bilm: CountingBiLM, tmp_path: Path) -> None:
    cached = ActivationCache(tmp_path, dtype="float32").get_or_build(bilm, SENTENCES, 3, False)
    layers, mask = cached.batch([2, 3])
    assert layers.shape == (3, 2, 6, 32) and layers.dtype == torch.float32
    assert mask.tolist() == [[True] * 6, [True] + [False] * 5]
    assert layers[:, 1, 1:].abs().sum() == 0
    live, live_mask = live_activations(bilm, [SENTENCES[2], SENTENCES[3]])
    assert torch.equal(mask, live_mask)
    torch.testing.assert_close(layers, live, atol=1e-5, rtol=0)


def test_float16_entries_store_half_precision(bilm: CountingBiLM, tmp_path: Path) -> None:
    cached = ActivationCache(tmp_path).get_or_build(bilm, SENTENCES, 2, False)
    assert cached.activations.dtype == np.float16
    live, _ = live_activations(bilm, SENTENCES)
    layers, _ = cached.batch(np.arange(len(SENTENCES)))
    torch.testing.assert_close(layers, live, atol=2e-3, rtol=2e-3)


def test_a_hit_runs_no_bilm_even_from_a_new_cache_object(
    bilm: CountingBiLM, tmp_path: Path
) -> None:
    first = ActivationCache(tmp_path).get_or_build(bilm, SENTENCES, 2, False)
    assert bilm.calls == 3  # 5 sentences, batches of 2
    again = ActivationCache(tmp_path).get_or_build(bilm, SENTENCES, 2, False)
    assert bilm.calls == 3
    assert again.key == first.key
    np.testing.assert_array_equal(again.activations, first.activations)
    assert [p.name for p in tmp_path.iterdir()] == [first.key]  # no staging left behind


def test_key_follows_weights_and_data(bilm: CountingBiLM, tmp_path: Path) -> None:
    cache = ActivationCache(tmp_path)
    key = cache.key(bilm, SENTENCES)
    assert cache.key(bilm, [list(tokens) for tokens in SENTENCES]) == key
    changed_token = [*SENTENCES[:-1], ["the", "dog", "sat", "up"]]
    assert cache.key(bilm, changed_token) != key
    assert cache.key(bilm, SENTENCES[:-1]) != key
    assert ActivationCache(tmp_path, dtype="float32").key(bilm, SENTENCES) != key
    with torch.no_grad():
        bilm.forward_lstm.layers[0].bias[0] += 1e-3
    assert cache.key(bilm, SENTENCES) != key


def test_token_boundaries_are_part_of_the_data_hash() -> None:
    assert data_fingerprint([["ab", "c"]]) != data_fingerprint([["a", "bc"]])
    assert data_fingerprint([["a"], ["b"]]) != data_fingerprint([["a", "b"]])


@pytest.mark.parametrize("damage", ["truncate", "garble_meta", "drop_offsets"])
def test_damaged_entry_is_rebuilt(bilm: CountingBiLM, tmp_path: Path, damage: str) -> None:
    cache = ActivationCache(tmp_path, dtype="float32")
    good = np.array(cache.get_or_build(bilm, SENTENCES, 8, False).activations)
    entry = tmp_path / cache.key(bilm, SENTENCES)
    if damage == "truncate":
        path = entry / ACTIVATIONS_FILE
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "garble_meta":
        (entry / META_FILE).write_text("{not json")
    else:
        (entry / "offsets.npy").unlink()
    calls = bilm.calls
    rebuilt = cache.get_or_build(bilm, SENTENCES, 8, False)
    assert bilm.calls == calls + 1
    np.testing.assert_array_equal(rebuilt.activations, good)


def test_build_leaves_training_mode_and_refuses_stateful_bilm(
    bilm: CountingBiLM, tmp_path: Path
) -> None:
    bilm.train()
    ActivationCache(tmp_path).get_or_build(bilm, SENTENCES, 2, False)
    assert bilm.training
    bilm.stateful = True  # as read_bilm_tf(stateful=True) builds it
    with pytest.raises(ValueError, match="stateless"):
        live_activations(bilm, SENTENCES)


def test_pad_ragged_matches_a_per_row_loop() -> None:
    rng = np.random.default_rng(0)
    lengths = np.array([3, 0, 5, 1, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = rng.normal(size=(int(offsets[-1]), 2)).astype(np.float32)
    indices = np.array([4, 2, 1, 2])
    padded, mask = pad_ragged(flat, offsets, indices)
    assert padded.shape == (4, 5, 2)
    for row, index in enumerate(indices):
        n = lengths[index]
        np.testing.assert_array_equal(padded[row, :n], flat[offsets[index] : offsets[index + 1]])
        assert not padded[row, n:].any() and mask[row].sum() == n
    assert flat_positions(np.array([5, 0]), np.array([2, 3])).tolist() == [5, 6, 0, 1, 2]


def test_a_good_entry_published_meanwhile_is_kept(bilm: CountingBiLM, tmp_path: Path) -> None:
    cache = ActivationCache(tmp_path / "cache", dtype="float32")
    entry = cache.get_or_build(bilm, SENTENCES, 8, False)
    staging = tmp_path / "staging"
    shutil.copytree(entry.directory, staging)
    (staging / ACTIVATIONS_FILE).write_bytes(b"from a slower job")
    calls = bilm.calls
    _publish(staging, entry.directory, entry.key)
    reopened = cache.get_or_build(bilm, SENTENCES, 8, False)
    assert bilm.calls == calls  # the first entry was kept, not replaced and rebuilt
    np.testing.assert_array_equal(reopened.activations, entry.activations)


def test_an_empty_split_gives_an_empty_entry(bilm: CountingBiLM, tmp_path: Path) -> None:
    cached = ActivationCache(tmp_path).get_or_build(bilm, [], 8, False)
    assert len(cached) == 0 and cached.activations.shape == (0, 3, 32)
    assert bilm.calls == 0
