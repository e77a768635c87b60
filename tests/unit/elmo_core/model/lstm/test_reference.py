import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from elmo_core.config import LSTMConfig
from elmo_core.model.lstm.reference import LSTMState, ProjectedLSTM, ProjectedLSTMLayer

B, T, IN, H, P = 3, 5, 6, 8, 6


def _stack(cell_clip=0.5, proj_clip=0.3, skip=True, num_layers=2, dropout=0.0, scale=2.0):
    """A float64 stack with weights scaled up so that both clips are hit."""
    torch.manual_seed(0)
    config = LSTMConfig(
        cell_dim=H,
        projection_dim=P,
        num_layers=num_layers,
        cell_clip=cell_clip,
        proj_clip=proj_clip,
        use_skip_connections=skip,
    )
    stack = ProjectedLSTM(config, IN, dropout).double()
    with torch.no_grad():
        for parameter in stack.parameters():
            parameter.mul_(scale).add_(0.1 * torch.randn_like(parameter))
    return stack


def _reference(numpy_reference, stack, inputs, mask, state=None, input_scales=None):
    h0 = np.zeros((len(stack.layers), inputs.shape[0], P)) if state is None else state.h.numpy()
    c0 = np.zeros((len(stack.layers), inputs.shape[0], H)) if state is None else state.c.numpy()
    cfg = stack.config
    return numpy_reference.lstm_stack(
        inputs.numpy(),
        mask.numpy(),
        [numpy_reference.tf_cell_from_layer(layer) for layer in stack.layers],
        h0,
        c0,
        cfg.cell_clip,
        cfg.proj_clip,
        cfg.use_skip_connections,
        input_scales,
    )


def _inputs(batch=B, steps=T):
    generator = torch.Generator().manual_seed(1)
    return 2.0 * torch.randn(batch, steps, IN, dtype=torch.float64, generator=generator)


def test_parameter_layout_and_effective_forget_bias():
    layer = ProjectedLSTMLayer(IN, H, P, 3.0, 3.0)
    assert layer.input_weight.shape == (4 * H, IN)
    assert layer.recurrent_weight.shape == (4 * H, P)
    assert layer.projection_weight.shape == (P, H)
    expected_bias = torch.zeros(4 * H)
    expected_bias[H : 2 * H] = 1.0  # gate order (i, f, g, o); the +1 lives in the parameter
    assert torch.equal(layer.bias.detach(), expected_bias)


def test_stack_matches_the_reference_step_by_step_with_clips_hit(numpy_reference):
    stack = _stack().eval()
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    for steps in range(1, T + 1):  # every prefix: outputs and both states after each step
        outputs, state = stack(inputs[:, :steps], mask[:, :steps])
        ref_outputs, ref_h, ref_c, seen = _reference(
            numpy_reference, stack, inputs[:, :steps], mask[:, :steps]
        )
        for output, ref_output in zip(outputs, ref_outputs, strict=True):
            np.testing.assert_allclose(output.detach().numpy(), ref_output, atol=1e-12)
        np.testing.assert_allclose(state.h.detach().numpy(), ref_h, atol=1e-12)
        np.testing.assert_allclose(state.c.detach().numpy(), ref_c, atol=1e-12)
    assert seen["max_abs_c"] > 0.5 and seen["max_abs_h"] > 0.3  # both clips were active
    assert state.c.abs().max() <= 0.5 and state.h.abs().max() <= 0.3
    assert outputs[0].abs().max() <= 0.3 + 1e-12  # no residual on layer 0
    assert outputs[1].abs().max() > 0.3  # the residual is added after the clip


@pytest.mark.parametrize("skip", [True, False])
def test_without_clipping_or_skips_matches_the_reference(numpy_reference, skip):
    stack = _stack(cell_clip=None, proj_clip=None, skip=skip, num_layers=3, scale=1.0).eval()
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    outputs, state = stack(inputs, mask)
    ref_outputs, ref_h, ref_c, _ = _reference(numpy_reference, stack, inputs, mask)
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        np.testing.assert_allclose(output.detach().numpy(), ref_output, atol=1e-12)
    np.testing.assert_allclose(state.c.detach().numpy(), ref_c, atol=1e-12)


def test_masked_positions_copy_the_state_through_and_output_zero(numpy_reference):
    stack = _stack().eval()
    inputs = _inputs()
    mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 1, 0, 1]], dtype=torch.bool
    )  # full, right-padded, holes
    outputs, state = stack(inputs, mask)
    ref_outputs, ref_h, ref_c, _ = _reference(numpy_reference, stack, inputs, mask)
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        np.testing.assert_allclose(output.detach().numpy(), ref_output, atol=1e-12)
        assert torch.all(output[~mask] == 0)
    np.testing.assert_allclose(state.h.detach().numpy(), ref_h, atol=1e-12)
    # the right-padded row ends in the state of its last real token
    _, short_state = stack(inputs[1:2, :2], mask[1:2, :2])
    torch.testing.assert_close(state.h[:, 1:2], short_state.h, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.c[:, 1:2], short_state.c, rtol=0, atol=1e-12)


def test_carried_state_equals_one_long_run():
    stack = _stack().eval()
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    whole, whole_state = stack(inputs, mask)
    first, state = stack(inputs[:, :2], mask[:, :2])
    second, final_state = stack(inputs[:, 2:], mask[:, 2:], state)
    for k in range(2):
        torch.testing.assert_close(torch.cat([first[k], second[k]], dim=1), whole[k])
    torch.testing.assert_close(final_state.h, whole_state.h)
    torch.testing.assert_close(final_state.c, whole_state.c)


class _FixedScale(nn.Module):
    """A deterministic stand-in for dropout: multiplies the next input by a preset tensor."""

    def __init__(self, scales: list[torch.Tensor]) -> None:
        super().__init__()
        self.scales = list(scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scales.pop(0)


def test_dropout_hits_every_layer_input_and_the_residual_adds_the_dropped_input(numpy_reference):
    stack = _stack().eval()
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    generator = torch.Generator().manual_seed(2)
    scales = [
        (torch.rand(B, T, width, generator=generator) > 0.3).double() / 0.7 for width in (IN, P)
    ]
    stack.dropout = _FixedScale(scales)
    outputs, _ = stack(inputs, mask)
    ref_outputs, *_ = _reference(
        numpy_reference, stack, inputs, mask, input_scales=[s.numpy() for s in scales]
    )
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        np.testing.assert_allclose(output.detach().numpy(), ref_output, atol=1e-12)


def test_dropout_is_active_in_train_mode_only():
    stack = _stack(dropout=0.5)
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    stack.eval()
    eval_outputs, _ = stack(inputs, mask)
    torch.testing.assert_close(stack(inputs, mask)[0][1], eval_outputs[1], rtol=0, atol=0)
    stack.train()
    assert not torch.allclose(stack(inputs, mask)[0][1], eval_outputs[1])


def test_module_keeps_no_state_between_calls():
    stack = _stack().eval()
    inputs, mask = _inputs(), torch.ones(B, T, dtype=torch.bool)
    first, _ = stack(inputs, mask)
    second, _ = stack(inputs, mask)
    torch.testing.assert_close(first[1], second[1], rtol=0, atol=0)
    assert set(dict(stack.named_buffers())) == set()


def test_layer_gradients_match_finite_differences():
    torch.manual_seed(0)
    layer = ProjectedLSTMLayer(3, 4, 2, cell_clip=10.0, proj_clip=10.0).double()
    names = [name for name, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())
    inputs = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, False, True]])

    def run(inputs, h0, c0, *params):
        outputs, h, c = functional_call(
            layer, dict(zip(names, params, strict=True)), (inputs, mask, h0, c0)
        )
        return outputs, h, c

    assert torch.autograd.gradcheck(run, (inputs, h0, c0, *params))


def test_zero_state_shapes():
    stack = _stack(num_layers=3)
    state = stack.zero_state(4)
    assert isinstance(state, LSTMState)
    assert state.h.shape == (3, 4, P) and state.c.shape == (3, 4, H)
    assert state.h.dtype == torch.float64
