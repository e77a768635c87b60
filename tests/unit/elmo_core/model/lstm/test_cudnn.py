import pytest
import torch

from elmo_core.config import LSTMConfig
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.cudnn import CudnnProjectedLSTM
from elmo_core.model.lstm.reference import LSTMState, ProjectedLSTM
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids

B, T, IN, H, P = 4, 6, 5, 8, 6
UNCLIPPED = LSTMConfig(cell_dim=H, projection_dim=P, num_layers=2, cell_clip=None, proj_clip=None)


def _pair(dropout=0.0, device="cpu", dtype=torch.float64):
    """The reference and the fused stack holding the same (non-trivial) weights."""
    torch.manual_seed(0)
    reference = ProjectedLSTM(UNCLIPPED, IN, dropout).to(device, dtype)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    fused = CudnnProjectedLSTM(UNCLIPPED, IN, dropout).to(device, dtype)
    fused.load_state_dict(reference.state_dict())  # the same layout, key for key
    return reference, fused


def _inputs(device="cpu", dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(B, T, IN, generator=generator, dtype=dtype).to(device).requires_grad_()


def _state(device="cpu", dtype=torch.float64):
    generator = torch.Generator().manual_seed(2)
    h = torch.randn(2, B, P, generator=generator, dtype=dtype)
    c = torch.randn(2, B, H, generator=generator, dtype=dtype)
    return LSTMState(h.to(device), c.to(device))


def _run(stack, inputs, mask, state, seed=3):
    torch.manual_seed(seed)  # the same dropout masks for both stacks
    outputs, new_state = stack(inputs, mask, state)
    loss = sum((output * (k + 1)).sum() for k, output in enumerate(outputs))
    loss = loss + new_state.h.sum() + 2 * new_state.c.sum()
    grads = torch.autograd.grad(loss, [inputs, *stack.parameters()])
    return outputs, new_state, grads


def _assert_same(got, expected, atol):
    (outputs, state, grads), (ref_outputs, ref_state, ref_grads) = got, expected
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        torch.testing.assert_close(output, ref_output, rtol=0, atol=atol)
    torch.testing.assert_close(state.h, ref_state.h, rtol=0, atol=atol)
    torch.testing.assert_close(state.c, ref_state.c, rtol=0, atol=atol)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=atol * 10)


def _right_padded_mask(device="cpu"):
    lengths = torch.tensor([T, 3, 0, 1], device=device)  # a full row, short rows, an empty row
    return torch.arange(T, device=device) < lengths.unsqueeze(1)


@pytest.mark.parametrize("masked", [False, True], ids=["full", "right-padded"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_matches_the_reference_outputs_states_and_gradients(masked, dropout):
    reference, fused = _pair(dropout)
    mask = _right_padded_mask() if masked else torch.ones(B, T, dtype=torch.bool)
    inputs, state = _inputs(), _state()
    expected = _run(reference, inputs, mask, state)
    got = _run(fused, inputs, mask, state)
    _assert_same(got, expected, atol=1e-12)
    if masked:  # an empty row keeps its state; padded outputs are zero before the residual
        torch.testing.assert_close(got[1].h[:, 2], state.h[:, 2], rtol=0, atol=0)
        assert torch.all(got[0][0][2] == 0)


def test_a_mask_with_holes_falls_back_to_the_same_result():
    reference, fused = _pair()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 2] = False  # a padding token inside a row: no packing can express it
    inputs = _inputs()
    _assert_same(_run(fused, inputs, mask, None), _run(reference, inputs, mask, None), 1e-12)


def test_clipping_is_refused_with_the_config_key():
    with pytest.raises(ConfigError, match="model.lstm_impl"):
        CudnnProjectedLSTM(LSTMConfig(cell_dim=H, projection_dim=P), IN)


def test_kernel_modules_are_not_part_of_the_state_dict():
    _, fused = _pair()
    assert fused.state_dict().keys() == ProjectedLSTM(UNCLIPPED, IN).state_dict().keys()
    assert all(parameter.device.type == "cpu" for parameter in fused.parameters())


@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_float32")
def test_cudnn_on_gpu_matches_the_reference_in_float32():
    reference, fused = _pair(device="cuda", dtype=torch.float32)
    mask = _right_padded_mask("cuda")
    inputs, state = _inputs("cuda", torch.float32), _state("cuda", torch.float32)
    _assert_same(_run(fused, inputs, mask, state), _run(reference, inputs, mask, state), 1e-4)


def test_bilm_gives_the_same_activations_with_either_stack():
    lstm = tiny().lstm.model_copy(update={"cell_clip": None, "proj_clip": None})
    torch.manual_seed(0)
    fused = BiLM(tiny().model_copy(update={"lstm": lstm, "lstm_impl": "cudnn"})).double().eval()
    reference = BiLM(tiny().model_copy(update={"lstm": lstm, "lstm_impl": "reference"})).double()
    reference.load_state_dict(fused.state_dict())
    ids = batch_to_ids([["a", "rose", "is", "a", "rose"], ["is", "a"], []])
    expected = reference.eval()(ids).activations
    for got, want in zip(fused(ids).activations, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
