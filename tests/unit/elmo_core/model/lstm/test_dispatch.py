"""The dispatch table (``elmo_core.model.lstm``): what runs where, and a load that logs a swap."""

import logging

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import CHOICES, VARIANTS, implementation, resolve, training_defaults
from elmo_core.model.lstm.cudnn import CudnnProjectedLSTM
from elmo_core.model.lstm.fused import FusedProjectedLSTM
from elmo_core.model.lstm.graphed import GraphedProjectedLSTM
from elmo_core.model.lstm.reference import ProjectedLSTM
from elmo_core.model.serialization import read_bilm_dir, write_bilm_dir
from elmo_core.presets import tiny


def _config(impl: str, clipped: bool = True, batch_directions: bool = False):
    clip = 3.0 if clipped else None
    lstm = tiny().lstm.model_copy(update={"cell_clip": clip, "proj_clip": clip})
    update = {"lstm": lstm, "lstm_impl": impl, "batch_directions": batch_directions}
    return tiny().model_copy(update=update)


@pytest.mark.parametrize(
    ("impl", "clipped", "cuda", "expected"),
    [
        ("auto", True, False, FusedProjectedLSTM),
        ("auto", False, False, FusedProjectedLSTM),
        ("auto", True, True, GraphedProjectedLSTM),
        ("auto", False, True, CudnnProjectedLSTM),
        ("reference", False, False, ProjectedLSTM),
        ("cudnn", False, False, CudnnProjectedLSTM),
    ],
)
def test_bilm_builds_the_configured_stack(impl, clipped, cuda, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    bilm = BiLM(_config(impl, clipped))
    assert type(bilm.forward_lstm) is expected and type(bilm.backward_lstm) is expected


def test_auto_with_the_directions_batched_never_takes_the_cudnn_kernel():
    assert resolve(_config("auto", clipped=False, batch_directions=True), "cuda") == "graphed"


def test_every_variant_names_its_class_and_every_choice_a_variant():
    assert {name: implementation(name).__name__ for name in VARIANTS} == {
        "reference": "ProjectedLSTM",
        "cudnn": "CudnnProjectedLSTM",
        "compiled": "CompiledProjectedLSTM",
        "graphed": "GraphedProjectedLSTM",
        "fused": "FusedProjectedLSTM",
    }
    for choice in CHOICES.values():
        assert {choice.lstm_impl, choice.unclipped} <= set(VARIANTS)


def test_a_gpu_training_run_defaults_to_the_table_s_cuda_choice():
    assert training_defaults("cuda") == {"lstm_impl": "graphed", "batch_directions": True}


@pytest.mark.parametrize(
    ("saved", "cuda", "chosen"),
    [
        ("reference", False, FusedProjectedLSTM),
        ("compiled", False, FusedProjectedLSTM),
        ("graphed", False, FusedProjectedLSTM),
        ("reference", True, GraphedProjectedLSTM),
        ("fused", True, GraphedProjectedLSTM),
    ],
)
def test_a_variant_that_is_not_the_device_s_choice_loads_as_it_and_says_so(
    saved, cuda, chosen, tmp_path, monkeypatch, caplog
):
    torch.manual_seed(0)
    bilm = BiLM(_config(saved)).eval()
    write_bilm_dir(bilm, tmp_path / "model")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with caplog.at_level(logging.WARNING, logger="elmo_core.model.lstm"):
        loaded = read_bilm_dir(tmp_path / "model")
    variant = "graphed" if cuda else "fused"
    assert type(loaded.forward_lstm) is chosen
    assert loaded.config == bilm.config.model_copy(update={"lstm_impl": variant})
    [record] = caplog.records
    assert f"the {saved} LSTM; it runs {variant}" in record.getMessage()


@pytest.mark.parametrize(
    ("impl", "clipped", "cuda"),
    [
        ("auto", True, False),
        ("auto", False, True),
        ("fused", True, False),
        ("graphed", True, True),
        ("cudnn", False, True),
    ],
)
def test_the_device_s_choice_and_auto_load_as_saved_and_silently(
    impl, clipped, cuda, tmp_path, monkeypatch, caplog
):
    config = _config(impl, clipped)
    write_bilm_dir(BiLM(config), tmp_path / "model")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with caplog.at_level(logging.WARNING, logger="elmo_core.model.lstm"):
        assert read_bilm_dir(tmp_path / "model").config == config
    assert not caplog.records
