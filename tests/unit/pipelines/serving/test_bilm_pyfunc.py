import json

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException

from elmo_core.errors import ConfigError, DataError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from elmo_core.text.tokenize import MosesTokenizer, WhitespaceTokenizer
from pipelines.serving.bilm_pyfunc import BiLMEmbedder, EmbedOptions, model_signature

NUM_LAYERS, WIDTH = 3, 32  # tiny(): token layer + 2 LSTM layers, 2 × projection 16


def _embedder(tmp_path, tokenizer) -> BiLMEmbedder:
    torch.manual_seed(0)
    write_bilm_dir(BiLM(tiny(), 100), tmp_path / "bilm")
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": tokenizer.describe()}))
    embedder = BiLMEmbedder()
    embedder.load(tmp_path / "bilm", tmp_path / "manifest.json")
    return embedder


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> BiLMEmbedder:
    return _embedder(tmp_path_factory.mktemp("moses"), MosesTokenizer())


def _arrays(frame: pd.DataFrame) -> list[np.ndarray]:
    return [np.asarray(cell, dtype=np.float32) for cell in frame["embeddings"]]


def test_layers_are_the_bilm_activations_without_boundaries(embedder):
    tokens = ["The", "cat", "sat", "."]
    out = embedder.predict(None, pd.DataFrame({"tokens": [tokens]}))
    assert out["tokens"].tolist() == [tokens]
    (layers,) = _arrays(out)
    assert layers.shape == (NUM_LAYERS, len(tokens), WIDTH)
    with torch.no_grad():
        activations = embedder.bilm(batch_to_ids([tokens])).activations
    expected = np.stack([layer[0, 1:-1].numpy() for layer in activations])
    np.testing.assert_allclose(layers, expected, rtol=1e-5, atol=1e-6)


def test_sentence_column_is_tokenized_like_the_training_data(embedder):
    sentence = "Mr. Smith's cat didn't sit, did it?"
    from_text = embedder.predict(None, pd.DataFrame({"sentence": [sentence]}))
    tokens = MosesTokenizer().tokenize(sentence)[0]
    from_tokens = embedder.predict(None, pd.DataFrame({"tokens": [tokens]}))
    assert from_text["tokens"][0] == tokens
    assert "Mr." in tokens and "," in tokens
    np.testing.assert_array_equal(_arrays(from_text)[0], _arrays(from_tokens)[0])


def test_whitespace_manifest_splits_on_whitespace_only(tmp_path):
    embedder = _embedder(tmp_path, WhitespaceTokenizer())
    out = embedder.predict(None, pd.DataFrame({"sentence": ['He said , "no."  twice']}))
    assert out["tokens"][0] == ["He", "said", ",", '"no."', "twice"]


def test_same_sentence_gives_same_vectors_whatever_the_batch(embedder):
    sentences = [["a", "b", "c"], ["d"], ["a", "b", "c"], ["e", "f", "g", "h", "i"], []]
    out = embedder.predict(None, pd.DataFrame({"tokens": sentences}))
    together = _arrays(out)
    one_by_one = _arrays(
        embedder.predict(None, pd.DataFrame({"tokens": sentences}), params={"batch_size": 1})
    )
    assert out["embeddings"][4] == [[]] * NUM_LAYERS  # an empty sentence: L layers, no tokens
    # equal up to rounding: an AVX2 GEMM rounds a row by its place in the batch
    np.testing.assert_allclose(together[0], together[2], rtol=1e-5, atol=1e-6)
    for batched, alone in zip(together, one_by_one, strict=True):
        np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)


def test_layer_output_selects_one_layer_counting_negative_from_the_top(embedder):
    frame = pd.DataFrame({"tokens": [["x", "y"]]})
    (layers,) = _arrays(embedder.predict(None, frame))
    (first,) = _arrays(embedder.predict(None, frame, params={"output": "layer", "layer": 1}))
    (top,) = _arrays(embedder.predict(None, frame, params={"output": "layer", "layer": -1}))
    np.testing.assert_array_equal(first, layers[1])
    np.testing.assert_array_equal(top, layers[2])


def test_mix_is_uniform_by_default_and_uses_given_weights_as_they_are(embedder):
    frame = pd.DataFrame({"tokens": [["x", "y", "z"]]})
    (layers,) = _arrays(embedder.predict(None, frame))
    (uniform,) = _arrays(embedder.predict(None, frame, params={"output": "mix"}))
    weighted_params = {"output": "mix", "weights": [2.0, 0.0, -1.0]}
    (weighted,) = _arrays(embedder.predict(None, frame, params=weighted_params))
    np.testing.assert_allclose(uniform, layers.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weighted, 2 * layers[0] - layers[2], rtol=1e-5, atol=1e-6)


def test_mean_pool_gives_one_vector_per_layer_or_per_sentence(embedder):
    frame = pd.DataFrame({"tokens": [["x", "y", "z"], []]})
    (layers, _) = _arrays(embedder.predict(None, frame))
    pooled, empty = embedder.predict(None, frame, params={"mean_pool": True})["embeddings"]
    np.testing.assert_allclose(np.asarray(pooled), layers.mean(axis=1), rtol=1e-5, atol=1e-6)
    assert empty is None
    mixed = embedder.predict(None, frame, params={"output": "mix", "mean_pool": True})
    assert _arrays(mixed)[0].shape == (WIDTH,)


def test_a_sentence_without_tokens_has_no_vectors_and_no_mean(embedder):
    frame = pd.DataFrame({"sentence": ["", " "]})
    assert embedder.predict(None, frame)["embeddings"].tolist() == [[[]] * NUM_LAYERS] * 2
    pooled = embedder.predict(None, frame, params={"output": "mix", "mean_pool": True})
    assert pooled.to_dict("list") == {"tokens": [[], []], "embeddings": [None, None]}


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"output": "average"}, "params.output"),
        ({"output": "layer", "layer": 3}, "params.layer"),
        ({"output": "mix", "weights": [1.0, 1.0]}, "params.weights"),
        ({"batch_size": 0}, "params.batch_size"),
        ({"layers": 2}, "params.layers"),
    ],
)
def test_bad_params_are_invalid_parameter_errors_naming_their_key(embedder, params, key):
    with pytest.raises(MlflowException, match=f"key '{key}'") as caught:
        embedder.predict(None, pd.DataFrame({"tokens": [["x"]]}), params=params)
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert isinstance(caught.value.__cause__, ConfigError)
    assert caught.value.__cause__.key == key


def test_input_without_sentence_or_tokens_is_an_invalid_parameter_error(embedder):
    with pytest.raises(MlflowException, match="'sentence' \\(text\\) or 'tokens'") as caught:
        embedder.predict(None, pd.DataFrame({"text": ["hello"]}))
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert isinstance(caught.value.__cause__, DataError)


def test_signature_declares_both_inputs_and_the_param_defaults():
    signature = model_signature()
    assert signature.inputs.input_names() == ["sentence", "tokens"]
    assert not any(spec.required for spec in signature.inputs.inputs)
    defaults = {spec.name: spec.default for spec in signature.params.params}
    options = EmbedOptions()
    assert defaults == {
        "output": options.output,
        "layer": options.layer,
        "weights": [],
        "mean_pool": options.mean_pool,
        "batch_size": options.batch_size,
    }
    assert EmbedOptions.from_params(defaults) == options
