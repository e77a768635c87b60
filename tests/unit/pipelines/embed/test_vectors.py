"""embed_sentences equals the biLM and ELMo called directly, whatever the batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import Elmo
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from pipelines.embed.vectors import embed_sentences

SENTENCES = [
    ["the", "cat", "sat", "on", "the", "mat"],
    ["a"],
    ["colourless", "green", "ideas", "sleep", "furiously"],
    ["x", "y"],
    [],
]


@pytest.fixture(scope="module")
def bilm() -> BiLM:
    torch.manual_seed(0)
    return BiLM(tiny().model_copy(update={"num_samples": 4}), 20).eval()


def _alone(bilm: BiLM, tokens: list[str]) -> list[np.ndarray]:
    """The biLM's layers for one sentence in a batch of its own: ``L × (T, 2P)``."""
    with torch.no_grad():
        output = bilm(batch_to_ids([tokens]))
    return [layer[0, 1:-1].numpy() for layer in output.activations]


@pytest.mark.parametrize("batch_size", [1, 2, 64])
def test_all_layers_equal_the_bilm_on_each_sentence_alone(bilm, batch_size):
    vectors = embed_sentences(bilm, SENTENCES, "all", batch_size)

    for tokens, got in zip(SENTENCES[:-1], vectors, strict=False):
        expected = np.stack(_alone(bilm, tokens))  # (L, T, 2P)
        assert got.shape == expected.shape == (3, len(tokens), 32)
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_top_is_the_last_layer(bilm):
    for tokens, got in zip(SENTENCES, embed_sentences(bilm, SENTENCES, "top", 2), strict=True):
        if tokens:
            np.testing.assert_allclose(got, _alone(bilm, tokens)[-1], atol=1e-5)


def test_mix_is_an_elmo_scalar_mix_at_its_initial_weights_and_mean_its_token_average(bilm):
    elmo = Elmo(bilm, 1, dropout=0.0, scalar_mix_parameters=[0.0, 0.0, 0.0]).eval()
    with torch.no_grad():
        reference = elmo(batch_to_ids(SENTENCES[:-1]))["elmo_representations"][0]  # (B, T, 2P)

    mixed = embed_sentences(bilm, SENTENCES, "mix", 3)
    means = embed_sentences(bilm, SENTENCES, "mean", 3)

    for row, tokens in enumerate(SENTENCES[:-1]):
        expected = reference[row, : len(tokens)].numpy()
        np.testing.assert_allclose(mixed[row], expected, atol=1e-5)
        np.testing.assert_allclose(means[row], expected.mean(axis=0), atol=1e-5)


def test_a_sentence_without_tokens_has_no_token_rows_and_a_zero_mean(bilm):
    shapes = {
        output: embed_sentences(bilm, [[]], output, 4)[0].shape
        for output in ("all", "top", "mix", "mean")
    }

    assert shapes == {"all": (3, 0, 32), "top": (0, 32), "mix": (0, 32), "mean": (32,)}
    assert not embed_sentences(bilm, [[]], "mean", 4)[0].any()


def test_vectors_come_back_in_input_order_as_float32(bilm):
    vectors = embed_sentences(bilm, SENTENCES, "top", 2)

    assert [v.shape[0] for v in vectors] == [len(s) for s in SENTENCES]
    assert {v.dtype for v in vectors} == {np.dtype(np.float32)}
