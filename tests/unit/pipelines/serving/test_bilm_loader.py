"""Resolving and loading a biLM from directories, runs, bilm-tf files and remote URLs.

MLflow URIs (``models:/name@alias``, ``runs:/``) need a tracking store: their tests are in
``tests/integration/test_register.py`` and ``test_evaluate.py``.
"""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
import torch

from elmo_core.errors import ConfigError, WeightsError
from elmo_core.interop.bilm_tf import write_bilm_tf
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from pipelines.serving.bilm_loader import (
    OPTIONS_TAG,
    PATH_TAG,
    URI_TAG,
    BiLMReference,
    load_bilm,
    resolve_bilm,
)

VOCAB = 100


def _bilm(seed: int) -> BiLM:
    torch.manual_seed(seed)
    return BiLM(tiny(), VOCAB)


def _assert_same_weights(loaded: BiLM, saved: BiLM) -> None:
    expected = saved.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name])


def test_a_relative_path_is_made_absolute_and_loads_in_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = _bilm(0)
    write_bilm_dir(saved, tmp_path / "models" / "bilm")
    monkeypatch.chdir(tmp_path)
    reference = resolve_bilm("models/bilm")
    assert reference.kind == "directory"
    assert reference.location == str(tmp_path / "models" / "bilm")
    assert reference.tags == {PATH_TAG: str(tmp_path / "models" / "bilm")}
    monkeypatch.chdir(tmp_path / "models")  # a worker elsewhere loads the same directory
    _assert_same_weights(load_bilm(reference).bilm, saved)


def test_a_run_directory_is_pinned_to_its_latest_checkpoint(tmp_path: Path) -> None:
    early, late = _bilm(1), _bilm(2)
    checkpoints = tmp_path / "run" / "checkpoints"
    write_bilm_dir(early, checkpoints / "step_000002" / "model")
    write_bilm_dir(late, checkpoints / "step_000010" / "model")
    (tmp_path / "run" / "LATEST").write_text("checkpoints/step_000010\n")
    reference = resolve_bilm(tmp_path / "run")
    assert reference.location == str(checkpoints / "step_000010" / "model")
    write_bilm_dir(_bilm(3), checkpoints / "step_000012" / "model")  # training goes on
    (tmp_path / "run" / "LATEST").write_text("checkpoints/step_000012\n")
    loaded = load_bilm(reference)
    assert loaded.model_dir == checkpoints / "step_000010" / "model"
    _assert_same_weights(loaded.bilm, late)
    assert not loaded.bilm.training and loaded.tokenizer is None


def test_the_reference_crosses_a_process_boundary_as_json(tmp_path: Path) -> None:
    write_bilm_dir(_bilm(0), tmp_path / "bilm")
    reference = resolve_bilm(tmp_path / "bilm")
    assert BiLMReference.model_validate(reference.model_dump(mode="json")) == reference


def test_a_bilm_tf_file_with_its_options_loads_into_our_format(tmp_path: Path) -> None:
    saved = _bilm(4).eval()
    write_bilm_tf(saved, tmp_path / "options.json", tmp_path / "weights.hdf5")
    reference = resolve_bilm(tmp_path / "weights.hdf5", tmp_path / "options.json")
    assert (reference.kind, reference.options) == ("bilm_tf", str(tmp_path / "options.json"))
    assert reference.tags[OPTIONS_TAG] == str(tmp_path / "options.json")
    loaded = load_bilm(reference, tmp_path / "work")
    assert loaded.model_dir == tmp_path / "work" / "bilm"
    assert (loaded.model_dir / "model_config.json").is_file()
    expected = {k: v for k, v in saved.state_dict().items() if not k.startswith("softmax.")}
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded.bilm.state_dict()[name], tensor)


def test_a_bilm_tf_file_without_options_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_bilm(tmp_path / "weights.hdf5", options_key="bilm_options")
    assert raised.value.key == "bilm_options"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("missing", "no such checkpoint directory"),
        ("empty", "not a model, checkpoint or run directory"),
        ("weights.hdf5", "no such file"),
        ("memory://loader-test/missing", "no biLM at this URL"),
    ],
)
def test_a_missing_source_is_a_weights_error_naming_it(
    tmp_path: Path, source: str, message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "options.json").write_text("{}")
    named = source if "://" in source else str(tmp_path / source)
    with pytest.raises(WeightsError, match=message) as raised:
        resolve_bilm(named, tmp_path / "options.json" if source.endswith(".hdf5") else None)
    assert source in str(raised.value)


def test_a_remote_checkpoint_is_found_and_copied_locally(tmp_path: Path) -> None:
    saved = _bilm(5)
    write_bilm_dir(saved, tmp_path / "local")
    fs = fsspec.filesystem("memory")
    for name in ("model_config.json", "model.pt"):
        fs.pipe(f"/loader-test/run/ckpt/model/{name}", (tmp_path / "local" / name).read_bytes())
    reference = resolve_bilm("memory://loader-test/run/ckpt/")
    assert (reference.kind, reference.location) == ("remote", "memory://loader-test/run/ckpt/model")
    assert reference.tags == {URI_TAG: "memory://loader-test/run/ckpt"}
    loaded = load_bilm(reference, tmp_path / "work")
    assert loaded.model_dir == tmp_path / "work" / "bilm"
    _assert_same_weights(loaded.bilm, saved)
