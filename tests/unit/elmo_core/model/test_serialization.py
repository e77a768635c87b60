import pytest
import torch

from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.fused import FusedProjectedLSTM
from elmo_core.model.lstm.reference import ProjectedLSTM
from elmo_core.model.serialization import CONFIG_FILE, read_bilm_dir, write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids


def test_save_then_load_gives_identical_weights_and_outputs(tmp_path):
    torch.manual_seed(0)
    bilm = BiLM(tiny().model_copy(update={"lstm_impl": "fused"}), vocab_size=100).eval()
    write_bilm_dir(bilm, tmp_path / "model")
    loaded = read_bilm_dir(tmp_path / "model").eval()
    assert loaded.vocab_size == 100
    assert loaded.config == bilm.config
    for name, tensor in bilm.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    ids = batch_to_ids([["The", "cat", "sat"], ["Hi"]])
    with torch.no_grad():
        expected = bilm(ids).activations
        actual = loaded(ids).activations
    for left, right in zip(expected, actual, strict=True):
        assert torch.equal(left, right)
    assert not list((tmp_path / "model").glob(".*"))  # no temporary files left behind


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu-machine", "cuda-machine"])
def test_the_reference_loop_loads_as_the_device_s_choice_with_the_same_outputs(
    tmp_path, monkeypatch, cuda
):
    torch.manual_seed(0)
    bilm = BiLM(tiny().model_copy(update={"lstm_impl": "reference"})).eval()
    assert type(bilm.forward_lstm) is ProjectedLSTM
    write_bilm_dir(bilm, tmp_path / "model")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    loaded = read_bilm_dir(tmp_path / "model").eval()
    assert isinstance(loaded.forward_lstm, FusedProjectedLSTM)
    assert loaded.config.model_copy(update={"lstm_impl": "reference"}) == bilm.config
    ids = batch_to_ids([["The", "cat", "sat"], ["Hi"], []])
    with torch.inference_mode():
        expected, actual = bilm(ids).activations, loaded(ids).activations
    for left, right in zip(expected, actual, strict=True):
        torch.testing.assert_close(right, left, rtol=0, atol=1e-5)


def test_embedding_only_model_round_trips(tmp_path):
    write_bilm_dir(BiLM(tiny()), tmp_path / "m")
    assert read_bilm_dir(tmp_path / "m").softmax is None


def test_missing_files_and_mismatched_weights_are_clear_errors(tmp_path):
    with pytest.raises(WeightsError, match="model_config.json is missing"):
        read_bilm_dir(tmp_path)
    write_bilm_dir(BiLM(tiny(), vocab_size=100), tmp_path / "m")
    text = (tmp_path / "m" / CONFIG_FILE).read_text().replace('"cell_dim": 32', '"cell_dim": 8')
    (tmp_path / "m" / CONFIG_FILE).write_text(text)
    with pytest.raises(
        WeightsError,
        match=r"do not match.*input_weight \(128, 16\) in the file, \(32, 16\) by the config",
    ):
        read_bilm_dir(tmp_path / "m")


def test_elmo_is_built_from_a_training_run_directory(tmp_path):
    from elmo_core.model.elmo import Elmo
    from elmo_core.model.serialization import find_model_dir

    torch.manual_seed(0)
    bilm = BiLM(tiny(), vocab_size=100).eval()
    for step in (2, 10):
        write_bilm_dir(bilm, tmp_path / "run" / "checkpoints" / f"step_{step:06d}" / "model")
    (tmp_path / "run" / "LATEST").write_text("checkpoints/step_000010\n")
    assert find_model_dir(tmp_path / "run") == tmp_path / "run/checkpoints/step_000010/model"
    elmo = Elmo.from_checkpoint(tmp_path / "run", num_output_representations=2, dropout=0.0).eval()
    out = elmo(batch_to_ids([["The", "cat"], ["Hi"]]))
    assert len(out["elmo_representations"]) == 2
    assert out["elmo_representations"][0].shape == (2, 2, 2 * tiny().lstm.projection_dim)
    with pytest.raises(WeightsError, match="not a model, checkpoint or run directory"):
        Elmo.from_checkpoint(tmp_path, num_output_representations=1)
