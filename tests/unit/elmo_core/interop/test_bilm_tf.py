"""bilm-tf interop: layout mapping, exact round trips, the released shapes, and clear refusals.

The layout checks compare against the TF-layout converters and the NumPy reference of
``tests/unit/elmo_core/model/conftest.py`` (loaded by path: a conftest is not importable), which
state bilm-tf's maths independently of the mapping code under test.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest
import torch

from elmo_core.config import ModelConfig
from elmo_core.errors import ConfigError, WeightsError
from elmo_core.interop.bilm_tf import elmo_from_bilm_tf, read_bilm_tf, read_options, write_bilm_tf
from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import Elmo
from elmo_core.presets import original, tiny
from elmo_core.text.char_ids import batch_to_ids

VOCAB = 100
SENTENCES = [["The", "cat", "sat", "."], ["Éclair", "!"]]


def _load_reference() -> ModuleType:
    path = Path(__file__).parents[1] / "model" / "conftest.py"
    spec = importlib.util.spec_from_file_location("model_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _load_reference()


def _model(config: ModelConfig | None = None, vocab_size: int | None = None) -> BiLM:
    """A tiny biLM with every parameter moved off its initial value (biases included)."""
    torch.manual_seed(0)
    bilm = BiLM(config or tiny(), vocab_size).eval()
    with torch.no_grad():
        for parameter in bilm.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
        bilm.token_encoder.char_embedding.weight[0].zero_()
    return bilm


def _save(tmp_path: Path, bilm: BiLM, softmax: bool = False) -> tuple[Path, Path]:
    options, weights = tmp_path / "options.json", tmp_path / "weights.hdf5"
    write_bilm_tf(bilm, options, weights, tmp_path / "softmax.hdf5" if softmax else None)
    return options, weights


def _datasets(path: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as weights:
        weights.visititems(
            lambda name, item: (
                found.__setitem__(name, item[...]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return found


def _edit_options(path: Path, **sections: dict) -> None:
    options = json.loads(path.read_text())
    for section, values in sections.items():
        if isinstance(options.get(section), dict):
            options[section].update(values)
        else:
            options[section] = values
    path.write_text(json.dumps(options))


# --- round trips ---------------------------------------------------------------------------------


def test_save_then_load_is_bit_exact_for_every_parameter_and_the_config(tmp_path):
    bilm = _model(vocab_size=VOCAB)
    with torch.no_grad():  # effective forget biases ≥ 0.5: ``b − 1`` is exact in float32
        for layer in [*bilm.forward_lstm.layers, *bilm.backward_lstm.layers]:
            layer.bias[32:64].clamp_(min=0.5)
    options, weights = _save(tmp_path, bilm, softmax=True)
    loaded = read_bilm_tf(options, weights, stateful=True, softmax_file=tmp_path / "softmax.hdf5")
    assert loaded.config == bilm.config and loaded.vocab_size == VOCAB and loaded.stateful
    expected = bilm.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_forget_biases_far_from_one_round_trip_to_float32_rounding_of_the_offset(tmp_path):
    bilm = _model()
    with torch.no_grad():
        for layer in bilm.forward_lstm.layers:
            layer.bias.copy_(torch.linspace(-40.0, 40.0, layer.bias.numel()) + 1e-9)
    loaded = read_bilm_tf(*_save(tmp_path, bilm))
    for ours, theirs in zip(bilm.forward_lstm.layers, loaded.forward_lstm.layers, strict=True):
        tolerance = 2**-23 * ours.bias.abs().clamp(min=1.0)  # one ulp of max(1, |b|)
        assert torch.all((theirs.bias - ours.bias).abs() <= tolerance)
        assert torch.equal(theirs.input_weight, ours.input_weight)


def test_loading_then_saving_a_file_reproduces_every_dataset(tmp_path):
    options, weights = _save(tmp_path, _model())
    again = tmp_path / "again"
    write_bilm_tf(read_bilm_tf(options, weights), again / "options.json", again / "weights.hdf5")
    first, second = _datasets(weights), _datasets(again / "weights.hdf5")
    assert first.keys() == second.keys()
    for name, values in first.items():
        np.testing.assert_allclose(second[name], values, rtol=0, atol=1.2e-7, err_msg=name)
    assert json.loads((again / "options.json").read_text()) == json.loads(options.read_text())


# --- the layout ----------------------------------------------------------------------------------


def test_written_file_has_bilm_tf_names_shapes_and_layouts(tmp_path):
    bilm = _model()
    options, weights = _save(tmp_path, bilm)
    stored = _datasets(weights)
    cnn = REFERENCE.tf_char_cnn_from_module(bilm.token_encoder)
    assert stored["char_embed"].shape == (261, 4)
    np.testing.assert_array_equal(stored["char_embed"], cnn["char_embed"][1:])
    for index, (kernel, bias) in enumerate(cnn["convolutions"]):
        np.testing.assert_array_equal(stored[f"CNN/W_cnn_{index}"], kernel[np.newaxis])
        np.testing.assert_array_equal(stored[f"CNN/b_cnn_{index}"], bias)
    for name, values in cnn["highway"][0].items():
        np.testing.assert_array_equal(stored[f"CNN_high_0/{name}"], values)
    np.testing.assert_array_equal(stored["CNN_proj/W_proj"], cnn["W_proj"])
    for direction, lstm in enumerate((bilm.forward_lstm, bilm.backward_lstm)):
        for index, layer in enumerate(lstm.layers):
            cell = REFERENCE.tf_cell_from_layer(layer)
            prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{index}/LSTMCell"
            np.testing.assert_array_equal(stored[f"{prefix}/W_0"], cell["W_0"])
            np.testing.assert_allclose(stored[f"{prefix}/B"], cell["B"], rtol=0, atol=2e-7)
            np.testing.assert_array_equal(stored[f"{prefix}/W_P_0"], cell["W_P_0"])
    assert stored[f"{prefix}/W_0"].shape == (16 + 16, 4 * 32)
    assert len(stored) == 1 + 2 * 3 + 4 + 2 + 2 * 2 * 3
    written = json.loads(options.read_text())
    assert written["char_cnn"]["n_characters"] == 262
    assert written["lstm"] == {
        "dim": 32,
        "projection_dim": 16,
        "n_layers": 2,
        "cell_clip": 3.0,
        "proj_clip": 3.0,
        "use_skip_connections": True,
    }


def test_gate_blocks_and_forget_offset_land_where_tf_reads_them(tmp_path):
    bilm = _model()
    hidden = bilm.config.lstm.cell_dim
    with torch.no_grad():
        layer = bilm.forward_lstm.layers[0]
        layer.bias.copy_(torch.arange(4.0).repeat_interleave(hidden))  # ours i=0, f=1, g=2, o=3
    _, weights = _save(tmp_path, bilm)
    stored = _datasets(weights)["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"]
    # TF order (i, j, f, o) = ours (i, g, f, o); f loses the run-time 1.0
    expected = np.repeat(np.array([0.0, 2.0, 1.0 - 1.0, 3.0], dtype=np.float32), hidden)
    np.testing.assert_array_equal(stored, expected)


def _random_tf_file(weights: Path) -> dict[str, np.ndarray]:
    """Overwrite ``weights`` with random values (float32) in the same layout; return them."""
    rng = np.random.default_rng(0)
    arrays = {
        name: rng.normal(0.0, 0.5, size=values.shape).astype(np.float32)
        for name, values in _datasets(weights).items()
    }
    with h5py.File(weights, "w") as out:
        for name, values in arrays.items():
            out.create_dataset(name, data=values)
    return arrays


def test_loaded_model_computes_what_bilm_tf_computes_from_the_file(tmp_path):
    """A file written independently in TF layout, run by the NumPy reference of bilm-tf's maths."""
    options, weights = _save(tmp_path, _model())
    stored = {name: v.astype(np.float64) for name, v in _random_tf_file(weights).items()}
    bilm = read_bilm_tf(options, weights).double()
    cnn = {
        # bilm-tf's inference graph prepends a zero padding row to the stored table
        "char_embed": np.concatenate([np.zeros((1, 4)), stored["char_embed"]]),
        "convolutions": [(stored[f"CNN/W_cnn_{i}"][0], stored[f"CNN/b_cnn_{i}"]) for i in range(3)],
        "highway": [
            {
                k: stored[f"CNN_high_0/{k}"]
                for k in ("W_carry", "b_carry", "W_transform", "b_transform")
            }
        ],
        "W_proj": stored["CNN_proj/W_proj"],
        "b_proj": stored["CNN_proj/b_proj"],
    }
    ids = batch_to_ids(SENTENCES)[0]  # (T, W): one sentence, no markers
    expected_tokens = REFERENCE.char_cnn(ids.numpy(), cnn)  # (T, P)
    with torch.no_grad():
        tokens = bilm.token_encoder(ids)
    np.testing.assert_allclose(tokens.numpy(), expected_tokens, rtol=0, atol=1e-9)

    for direction, lstm in enumerate((bilm.forward_lstm, bilm.backward_lstm)):
        prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{{}}/LSTMCell/{{}}"
        cells = [{k: stored[prefix.format(i, k)] for k in ("W_0", "B", "W_P_0")} for i in range(2)]
        inputs = expected_tokens[np.newaxis]  # (1, T, P)
        mask = np.ones(inputs.shape[:2], dtype=bool)
        h0, c0 = np.zeros((2, 1, 16)), np.zeros((2, 1, 32))
        expected, *_ = REFERENCE.lstm_stack(inputs, mask, cells, h0, c0, 3.0, 3.0, True)
        with torch.no_grad():
            got, _ = lstm(torch.from_numpy(inputs), torch.from_numpy(mask))
        for layer in range(2):  # the forget bias is added in float32 on load: ~1e-7
            np.testing.assert_allclose(got[layer].numpy(), expected[layer], rtol=0, atol=1e-6)


# --- options -------------------------------------------------------------------------------------

RELEASED_OPTIONS = {  # the released 2x4096_512_2048cnn_2xhighway options.json
    "lstm": {
        "use_skip_connections": True,
        "projection_dim": 512,
        "cell_clip": 3,
        "proj_clip": 3,
        "dim": 4096,
        "n_layers": 2,
    },
    "char_cnn": {
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "embedding": {"dim": 16},
        "n_characters": 262,
        "max_characters_per_token": 50,
    },
}


def _write_options(tmp_path: Path, options: dict) -> Path:
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return path


def test_released_options_give_the_original_preset(tmp_path):
    config, vocab_size = read_options(_write_options(tmp_path, RELEASED_OPTIONS))
    assert config == original() and vocab_size is None


def test_training_options_with_261_characters_and_recipe_keys_are_accepted(tmp_path):
    options = json.loads(json.dumps(RELEASED_OPTIONS))
    options["char_cnn"]["n_characters"] = 261  # as bin/train_elmo.py writes it
    recipe = {"bidirectional": True, "dropout": 0.2, "all_clip_norm_val": 10.0, "n_epochs": 10}
    options |= recipe | {"n_tokens_vocab": 793471, "n_negative_samples_batch": 4096}
    options |= {"n_train_tokens": 1, "batch_size": 128, "unroll_steps": 20}
    config, vocab_size = read_options(_write_options(tmp_path, options))
    assert config.char_cnn.num_characters == 262 and vocab_size == 793471
    assert config.dropout == 0.2 and config.num_samples == 4096


def test_absent_optional_options_take_bilm_tfs_defaults_not_ours(tmp_path):
    options = json.loads(json.dumps(RELEASED_OPTIONS))
    for key in ("n_layers", "cell_clip", "proj_clip"):
        del options["lstm"][key]
    del options["char_cnn"]["n_highway"]
    config, _ = read_options(_write_options(tmp_path, options))
    assert config.lstm.num_layers == 1 and config.char_cnn.num_highway == 0
    assert config.lstm.cell_clip is None and config.lstm.proj_clip is None


@pytest.mark.parametrize(
    ("section", "values", "key"),
    [
        ("lstm", {"dims": 4096}, "lstm.dims"),
        ("char_cnn", {"embedding": {"dim": 16, "size": 3}}, "char_cnn.embedding.size"),
        ("extra", {"x": 1}, "extra.x"),
        ("char_cnn", {"activation": "gelu"}, "char_cnn.activation"),
        ("char_cnn", {"n_characters": 300}, "char_cnn.n_characters"),
        ("char_cnn", {"max_characters_per_token": 17}, "char_cnn.max_characters_per_token"),
        ("char_cnn", {"filters": [[1, "many"]]}, "char_cnn.filters"),
        ("lstm", {"projection_dim": 4096}, "lstm.projection_dim"),
        ("lstm", {"n_layers": 0}, "lstm.n_layers"),
        ("bidirectional", False, "bidirectional"),
        ("n_tokens_vocab", "lots", "n_tokens_vocab"),
    ],
)
def test_bad_options_raise_config_error_naming_the_bilm_tf_key(tmp_path, section, values, key):
    options = json.loads(json.dumps(RELEASED_OPTIONS))
    if isinstance(values, dict) and section in options:
        options[section].update(values)
    else:
        options[section] = values
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        read_options(_write_options(tmp_path, options))


def test_missing_required_option_and_unreadable_file_are_config_errors(tmp_path):
    options = json.loads(json.dumps(RELEASED_OPTIONS))
    del options["lstm"]["use_skip_connections"]
    with pytest.raises(ConfigError, match="key 'lstm.use_skip_connections'.*missing"):
        read_options(_write_options(tmp_path, options))
    (tmp_path / "broken.json").write_text("{lstm: ")
    with pytest.raises(ConfigError, match="broken.json.*not a JSON"):
        read_options(tmp_path / "broken.json")
    with pytest.raises(ConfigError, match="not found"):
        read_options(tmp_path / "absent.json")


# --- refusals ------------------------------------------------------------------------------------


def test_weights_that_do_not_match_the_options_name_the_dataset_and_both_shapes(tmp_path):
    options, weights = _save(tmp_path, _model())
    _edit_options(options, lstm={"dim": 48})
    cell = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"
    shapes = r"has shape \(32, 128\) in the file, the options imply \(32, 192\)"
    with pytest.raises(WeightsError, match=rf"weights.hdf5: dataset '{cell}' {shapes}"):
        read_bilm_tf(options, weights)


def test_a_missing_dataset_is_named(tmp_path):
    options, weights = _save(tmp_path, _model())
    with h5py.File(weights, "a") as out:
        del out["CNN_high_0/W_transform"]
    with pytest.raises(WeightsError, match="'CNN_high_0/W_transform' is missing"):
        read_bilm_tf(options, weights)


def test_layers_the_options_do_not_describe_are_refused(tmp_path):
    options, weights = _save(tmp_path, _model())
    _edit_options(options, char_cnn={"n_highway": 0})
    with pytest.raises(WeightsError, match="do not describe.*CNN_high_0/W_carry"):
        read_bilm_tf(options, weights)


def test_files_of_another_layout_are_refused_clearly(tmp_path):
    options, _ = _save(tmp_path, _model())
    other = tmp_path / "allennlp.hdf5"
    with h5py.File(other, "w") as out:
        out.create_dataset("_elmo_lstm/weight", data=np.zeros(3))
    with pytest.raises(WeightsError, match="not a bilm-tf weight file.*_elmo_lstm"):
        read_bilm_tf(options, other)
    torch.save({"weight": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(WeightsError, match="model.pt: not an HDF5 weight file"):
        read_bilm_tf(options, tmp_path / "model.pt")
    with pytest.raises(WeightsError, match="not found"):
        read_bilm_tf(options, tmp_path / "absent.hdf5")


# --- softmax, projection-free encoders, ELMo -----------------------------------------------------


def test_softmax_file_round_trips_and_is_checked_against_the_options(tmp_path):
    bilm = _model(vocab_size=VOCAB)
    options, weights = _save(tmp_path, bilm, softmax=True)
    softmax = tmp_path / "softmax.hdf5"
    assert _datasets(softmax).keys() == {"softmax/W", "softmax/b"}
    assert json.loads(options.read_text())["n_tokens_vocab"] == VOCAB
    assert read_bilm_tf(options, weights).softmax is None  # the released layout has none
    _edit_options(options, n_tokens_vocab=VOCAB + 1)
    with pytest.raises(WeightsError, match=r"'softmax/W' has shape \(100, 16\).*\(101, 16\)"):
        read_bilm_tf(options, weights, softmax_file=softmax)
    with pytest.raises(WeightsError, match="not a softmax file"):
        read_bilm_tf(options, weights, softmax_file=weights)
    with pytest.raises(WeightsError, match="no softmax"):
        write_bilm_tf(_model(), options, weights, softmax_file=softmax)


def test_without_cnn_proj_the_token_projection_is_the_identity(tmp_path):
    config = tiny().model_copy(
        update={"lstm": tiny().lstm.model_copy(update={"projection_dim": 20})}
    )  # the tiny filters number 4 + 8 + 8 = 20
    bilm = _model(config)
    with torch.no_grad():
        bilm.token_encoder.projection.weight.copy_(torch.eye(20))
        bilm.token_encoder.projection.bias.zero_()
    options, weights = _save(tmp_path, bilm)
    assert not any(name.startswith("CNN_proj") for name in _datasets(weights))
    loaded = read_bilm_tf(options, weights)
    assert torch.equal(loaded.token_encoder.projection.weight, torch.eye(20))
    with torch.no_grad():
        bilm.token_encoder.projection.bias.fill_(0.5)
    with pytest.raises(WeightsError, match="not the identity"):
        write_bilm_tf(bilm, options, weights)


def test_elmo_from_bilm_tf_runs_the_saved_weights(tmp_path):
    bilm = _model()
    options, weights = _save(tmp_path, bilm)
    elmo = elmo_from_bilm_tf(options, weights, 2, dropout=0.0)
    ids = batch_to_ids(SENTENCES)
    out = elmo(ids)
    assert len(out["elmo_representations"]) == 2
    assert out["elmo_representations"][0].shape == (2, 4, 32)
    expected = Elmo(bilm, 1, dropout=0.0)(ids)["elmo_representations"][0]
    torch.testing.assert_close(out["elmo_representations"][1], expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_file_at_the_released_2x4096_shapes_loads(tmp_path):
    """Shapes written straight from docs/architecture.md, "bilm-tf weight files" (not by
    write_bilm_tf), random float32 values."""
    rng = np.random.default_rng(0)
    shapes = {"char_embed": (261, 16), "CNN_proj/W_proj": (2048, 512), "CNN_proj/b_proj": (512,)}
    for index, (width, num) in enumerate(RELEASED_OPTIONS["char_cnn"]["filters"]):
        shapes |= {f"CNN/W_cnn_{index}": (1, width, 16, num), f"CNN/b_cnn_{index}": (num,)}
    for index in range(2):
        for kind in ("carry", "transform"):
            shapes |= {
                f"CNN_high_{index}/W_{kind}": (2048, 2048),
                f"CNN_high_{index}/b_{kind}": (2048,),
            }
        for direction in range(2):
            cell = f"RNN_{direction}/RNN/MultiRNNCell/Cell{index}/LSTMCell"
            shapes |= {
                f"{cell}/W_0": (1024, 16384),
                f"{cell}/B": (16384,),
                f"{cell}/W_P_0": (4096, 512),
            }
    weights = tmp_path / "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5"
    with h5py.File(weights, "w") as out:
        for name, shape in shapes.items():
            out.create_dataset(name, data=rng.standard_normal(shape, dtype=np.float32) * 0.01)
    bilm = read_bilm_tf(_write_options(tmp_path, RELEASED_OPTIONS), weights)
    assert bilm.config == original()
    with h5py.File(weights, "r") as stored:
        kernel = stored["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"][...]
    assert torch.equal(bilm.backward_lstm.layers[1].projection_weight, torch.from_numpy(kernel.T))
    with torch.no_grad():
        layers = bilm(batch_to_ids([SENTENCES[0]])).activations
    assert [layer.shape for layer in layers] == [(1, 6, 1024)] * 3
