"""Both directions run as one batched stack equal each stack run alone."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.config import LSTMConfig, ModelConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.directions import run_both_directions
from elmo_core.model.lstm.reference import LSTMState, ProjectedLSTM, ProjectedLSTMLayer, run_layer
from elmo_core.presets import tiny

B, T, P, H = 4, 5, 6, 8
VOCAB = 100  # more words than tiny's 64 sampled candidates
CLIPPED = LSTMConfig(cell_dim=H, projection_dim=P, num_layers=2, cell_clip=0.5, proj_clip=0.4)


def _stacks() -> tuple[ProjectedLSTM, ProjectedLSTM]:
    torch.manual_seed(0)
    stacks = (ProjectedLSTM(CLIPPED, P), ProjectedLSTM(CLIPPED, P))
    with torch.no_grad():
        for parameter in (p for stack in stacks for p in stack.parameters()):
            parameter.add_(0.5 * torch.randn_like(parameter))  # clips that bite
    return stacks


def test_outputs_states_and_gradients_equal_each_stack_run_alone() -> None:
    stacks = _stacks()
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(2, B, T, P, generator=generator).requires_grad_()
    lengths = torch.tensor([[T, 2, 0, 1], [3, T, 1, 0]])  # padded and empty rows
    masks = torch.arange(T) < lengths.unsqueeze(-1)  # (2, B, T)
    states = tuple(
        LSTMState(
            torch.randn(2, B, P, generator=generator), torch.randn(2, B, H, generator=generator)
        )
        for _ in range(2)
    )
    parameters = [inputs, *stacks[0].parameters(), *stacks[1].parameters()]

    def loss(outputs, new_states) -> torch.Tensor:
        total = sum((o * (k + 1)).sum() for layers in outputs for k, o in enumerate(layers))
        return total + sum(s.h.sum() + 2 * s.c.sum() for s in new_states)

    together = run_both_directions(stacks, inputs, masks, states)
    runs = [stack(inputs[i], masks[i], states[i]) for i, stack in enumerate(stacks)]
    alone = tuple(zip(*runs, strict=True))
    assert (alone[1][0].c.abs() == CLIPPED.cell_clip).any()  # the clips are exercised
    for got, expected in zip(together[0], alone[0], strict=True):
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for got_state, expected_state in zip(together[1], alone[1], strict=True):
        torch.testing.assert_close(got_state.h, expected_state.h, rtol=0, atol=1e-6)
        torch.testing.assert_close(got_state.c, expected_state.c, rtol=0, atol=1e-6)
    grads = torch.autograd.grad(loss(*together), parameters)
    expected_grads = torch.autograd.grad(loss(*alone), parameters)
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_the_bilm_with_directions_batched_scores_and_embeds_as_without() -> None:
    config = tiny().model_copy(update={"dropout": 0.0})  # dropout draws its masks differently
    torch.manual_seed(0)
    apart = BiLM(config, vocab_size=VOCAB).train()
    together = BiLM(config.model_copy(update={"batch_directions": True}), vocab_size=VOCAB).train()
    together.load_state_dict(apart.state_dict())
    generator = torch.Generator().manual_seed(2)
    width = config.char_cnn.max_chars_per_token
    windows = [
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
    ]
    results = []
    for model in (apart, together):
        torch.manual_seed(5)  # the same sampled candidates
        output, _ = model.training_loss(*windows)
        output.loss.backward()
        results.append((output.loss, [p.grad for p in model.parameters()], model(windows[0])))
    (loss, grads, embedded), (batched_loss, batched_grads, batched_embedded) = results
    torch.testing.assert_close(batched_loss, loss, rtol=1e-6, atol=0)
    for a, b in zip(batched_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(batched_embedded.activations, embedded.activations, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_the_cudnn_kernel_cannot_batch_directions() -> None:
    settings = {**tiny().model_dump(), "lstm_impl": "cudnn", "batch_directions": True}
    with pytest.raises(ValidationError, match="batch_directions"):
        ModelConfig.model_validate(settings)


class _Casts(TorchDispatchMode):
    """Counts the copies made to bfloat16 of tensors shaped like ``shape``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func._schema.name == "aten::_to_copy" and kwargs.get("dtype") == torch.bfloat16:
            self.count += tuple(args[0].shape) == self.shape
        return func(*args, **kwargs)


def test_under_autocast_a_layer_casts_its_recurrent_weight_once_not_once_a_step() -> None:
    layer = ProjectedLSTMLayer(3, H, P, 0.5, 0.4)  # inputs 3 wide: only W_recurrentᵀ is (P, 4H)
    inputs, mask = torch.randn(B, T, 3), torch.ones(B, T, dtype=torch.bool)
    h, c = torch.zeros(B, P), torch.zeros(B, H)
    with torch.autocast("cpu", dtype=torch.bfloat16), _Casts((P, 4 * H)) as casts:
        outputs, _, _ = run_layer(inputs, mask, h, c, layer.weights(), 0.5, 0.4)
    assert outputs.dtype == torch.bfloat16
    assert casts.count == 1


class _Ops(TorchDispatchMode):
    """Counts the ops dispatched: in eager mode on a GPU, each is about one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_both_directions_together_dispatch_about_half_the_ops_forward_and_backward() -> None:
    stacks = _stacks()
    window = 20  # bilm-tf's unroll: the step loop dominates
    inputs = torch.randn(2, B, window, P).requires_grad_()
    masks = torch.ones(2, B, window, dtype=torch.bool)
    counts = []
    for together in (False, True):
        with _Ops() as ops:
            if together:
                outputs, _ = run_both_directions(stacks, inputs, masks, (None, None))
                layers = [*outputs[0], *outputs[1]]
            else:
                layers = [out for i, s in enumerate(stacks) for out in s(inputs[i], masks[i])[0]]
            sum(layer.sum() for layer in layers).backward()
        counts.append(ops.count)
    apart, batched = counts
    assert batched < 0.6 * apart, counts  # 3,371 against 6,135 when written
