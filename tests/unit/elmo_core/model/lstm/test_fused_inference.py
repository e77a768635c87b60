"""The fused inference op (nothing kept for a backward) equals the training op and the reference."""

import importlib

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import fused_inference, fused_steps
from elmo_core.model.lstm.fused import fused_layer
from elmo_core.model.lstm.fused_training import lstm_layer
from elmo_core.model.lstm.reference import run_layer
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from tests.unit.elmo_core.model.lstm.fused_cases import (
    CELL_CLIP,
    PROJ_CLIP,
    B,
    H,
    I,
    P,
    T,
    _carried_windows,
    _leaves,
    _mask,
    _Ops,
    _weights,
)


@pytest.mark.parametrize("clips", [(CELL_CLIP, PROJ_CLIP), (None, None)], ids=["clip", "none"])
@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_without_gradients_it_keeps_nothing_and_equals_the_training_op_and_the_reference(
    directions, clips
):
    """Padded, empty and (batched) gapped rows, the state carried from one window to the next."""
    with torch.no_grad(), _Ops() as ops:
        inference = _carried_windows(fused_layer, directions, clips)
    assert set(ops.elmo) == {"lstm_layer_inference"}
    training = _carried_windows(  # the training op, its saved buffers dropped
        lambda *args: lstm_layer(*args[:4], *args[4], *args[5:])[:3], directions, clips
    )
    reference = _carried_windows(run_layer, directions, clips)
    if clips[0] is not None:
        assert (reference[-1].abs() == CELL_CLIP).float().mean() > 0.2  # the clips bite
        assert (reference[1].abs() == PROJ_CLIP).float().mean() > 0.1
    for got, op, expected in zip(inference, training, reference, strict=True):
        torch.testing.assert_close(got, op, rtol=0, atol=1e-5)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.fixture
def interpreted_triton(monkeypatch):
    """The fused ops' steps through :mod:`triton_kernels`' kernels on CPU tensors, the inference op
    on CUDA's path: decorated under ``TRITON_INTERPRET=1``, as in ``test_triton_kernels.py``, and
    decorated afresh afterwards."""
    pytest.importorskip("triton", reason="triton is not installed")
    module = importlib.import_module("elmo_core.model.lstm.triton_kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        importlib.reload(module)
    monkeypatch.setattr(fused_steps, "on_triton", lambda gates, state: True)
    monkeypatch.setattr(fused_inference, "_every_step", lambda inputs: True)
    yield
    importlib.reload(module)


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_without_gradients_the_triton_steps_equal_the_reference(directions, interpreted_triton):
    """CUDA's inference path: every row at every step, the state updated in place."""
    with torch.no_grad():
        got = _carried_windows(fused_layer, directions)
    for result, expected in zip(got, _carried_windows(run_layer, directions), strict=True):
        torch.testing.assert_close(result, expected, rtol=0, atol=1e-5)


def test_without_gradients_directions_whose_rows_are_reordered_run_together():
    """The second direction's rows: the first's numbers of tokens in another order, one with a
    gap; both run as one batched recurrence (the first's counts serve both)."""
    leaves = [leaf.detach() for leaf in _leaves(2)]
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(2, B, T, I, generator=generator)
    h, c = torch.randn(2, B, P, generator=generator), torch.randn(2, B, H, generator=generator)
    mask = torch.stack([_mask([T, 2, 0, 1], ()), _mask([1, T, 2, 0], ())])
    mask[1, 2] = torch.tensor([True, False, False, True, False])  # two tokens, a gap between
    assert not fused_inference._lengths_differ(mask)
    with torch.inference_mode():
        got = fused_layer(inputs, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
    expected = run_layer(inputs, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
    for result, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(result, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_without_gradients_every_step_in_torch_ops_equals_the_reference(directions, monkeypatch):
    """CUDA's inference path where the Triton kernels do not run, here on the CPU."""
    monkeypatch.setattr(fused_inference, "_every_step", lambda inputs: True)
    with torch.no_grad():
        got = _carried_windows(fused_layer, directions)
    for result, expected in zip(got, _carried_windows(run_layer, directions), strict=True):
        torch.testing.assert_close(result, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_without_gradients_a_batch_of_empty_rows_passes_its_state_through(directions):
    lead = () if directions is None else (directions,)
    leaves = [leaf.detach() for leaf in _leaves(directions)]
    h, c = torch.randn(*lead, B, P), torch.randn(*lead, B, H)
    empty = torch.zeros(*lead, B, T, dtype=torch.bool)
    with torch.inference_mode():
        outputs, new_h, new_c = fused_layer(
            torch.randn(*lead, B, T, I), empty, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP
        )
    assert not outputs.any() and torch.equal(new_h, h) and torch.equal(new_c, c)


def test_frozen_weights_take_the_inference_op_and_inputs_that_need_a_gradient_do_not():
    leaves = [leaf.detach() for leaf in _leaves(None)]
    inputs, mask = torch.randn(B, T, I), _mask([T, 2, 0, 1], ())
    h, c = torch.zeros(B, P), torch.zeros(B, H)
    for needs_grad, expected in ((False, "lstm_layer_inference"), (True, "lstm_layer")):
        with _Ops() as ops:
            fused_layer(inputs.requires_grad_(needs_grad), mask, h, c, _weights(leaves), 0.5, 0.3)
        assert ops.elmo == [expected]


def test_a_compiled_function_calling_it_without_gradients_runs_whole_and_matches_eager():
    leaves = [leaf.detach() for leaf in _leaves(2)]
    inputs, mask = torch.randn(2, B, T, I), _mask([T, 2, 0, 1], (2,))
    h, c = torch.randn(2, B, P), torch.randn(2, B, H)

    def layer(x, h, c):
        return fused_layer(x, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)

    with torch.inference_mode():
        expected = layer(inputs, h, c)
        got = torch.compile(layer, fullgraph=True)(inputs, h, c)
    for result, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(result, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("batch_directions", [False, True])
def test_the_bilm_embeds_as_with_the_reference_loop(batch_directions):
    config = tiny().model_copy(update={"batch_directions": batch_directions})
    torch.manual_seed(0)
    reference = BiLM(config.model_copy(update={"lstm_impl": "reference"})).eval()
    fused = BiLM(config.model_copy(update={"lstm_impl": "fused"})).eval()
    fused.load_state_dict(reference.state_dict())
    ids = batch_to_ids([["a", "b"], ["the", "cat", "sat", "on", "the", "mat"], [], ["hi"]])
    with torch.inference_mode():
        got, expected = fused(ids), reference(ids)
    for layer, reference_layer in zip(got.activations, expected.activations, strict=True):
        torch.testing.assert_close(layer, reference_layer, rtol=0, atol=1e-5)
    for state, reference_state in zip(got.state, expected.state, strict=True):
        torch.testing.assert_close(state.h, reference_state.h, rtol=0, atol=1e-5)
        torch.testing.assert_close(state.c, reference_state.c, rtol=0, atol=1e-5)
