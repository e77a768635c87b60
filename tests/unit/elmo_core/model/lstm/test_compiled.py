"""The stacks under torch.compile equal the reference: the compiled loop (Inductor's CPU backend
here) and the fused ops replayed as CUDA graphs (``graphed``; compiled, without graphs, here)."""

import pytest
import torch

from elmo_core.config import LSTMConfig, TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import fused as lstm_fused
from elmo_core.model.lstm import graphed as lstm_graphed
from elmo_core.model.lstm.compiled import CompiledProjectedLSTM
from elmo_core.model.lstm.directions import run_both_directions
from elmo_core.model.lstm.fused import FusedProjectedLSTM
from elmo_core.model.lstm.graphed import GraphedProjectedLSTM
from elmo_core.model.lstm.reference import LSTMState, ProjectedLSTM, ProjectedLSTMLayer
from elmo_core.presets import tiny
from elmo_core.training.step import TrainingStep
from tests.unit.elmo_core.model.lstm.replay_check import OVERWRITTEN, emulate_graph_replays

B, T, P, H = 4, 3, 6, 8  # layer 0's input is P wide too: every layer shares one compiled graph
CLIPPED = LSTMConfig(cell_dim=H, projection_dim=P, num_layers=2, cell_clip=0.5, proj_clip=0.4)


def _run(stack, inputs, mask, state):
    torch.manual_seed(3)  # the same dropout masks for both stacks
    outputs, new_state = stack(inputs, mask, state)
    loss = sum((output * (k + 1)).sum() for k, output in enumerate(outputs))
    loss = loss + new_state.h.sum() + 2 * new_state.c.sum()
    return outputs, new_state, torch.autograd.grad(loss, [inputs, *stack.parameters()])


@pytest.mark.parametrize("variant", [CompiledProjectedLSTM, GraphedProjectedLSTM])
def test_outputs_states_and_gradients_equal_the_reference_with_clips_that_bite(variant):
    torch.manual_seed(0)
    reference = ProjectedLSTM(CLIPPED, P, dropout=0.2)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    compiled = variant(CLIPPED, P, dropout=0.2)  # graphed: CUDA graphs only on CUDA
    compiled.load_state_dict(reference.state_dict())  # the same parameters, key for key
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(B, T, P, generator=generator).requires_grad_()
    state = LSTMState(
        torch.randn(2, B, P, generator=generator), torch.randn(2, B, H, generator=generator)
    )
    mask = torch.arange(T) < torch.tensor([T, 2, 0, 1]).unsqueeze(1)  # padded and empty rows

    (outputs, new_state, grads) = _run(compiled, inputs, mask, state)
    (ref_outputs, ref_state, ref_grads) = _run(reference, inputs, mask, state)

    assert (ref_state.c.abs() == CLIPPED.cell_clip).any()  # the clips are exercised
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-5)
    torch.testing.assert_close(new_state.h, ref_state.h, rtol=0, atol=1e-5)
    torch.testing.assert_close(new_state.c, ref_state.c, rtol=0, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5)


def test_both_directions_compiled_together_equal_the_reference_stacks_alone():
    torch.manual_seed(0)
    reference = (ProjectedLSTM(CLIPPED, P), ProjectedLSTM(CLIPPED, P))
    compiled = (CompiledProjectedLSTM(CLIPPED, P), CompiledProjectedLSTM(CLIPPED, P))
    for ours, theirs in zip(compiled, reference, strict=True):
        ours.load_state_dict(theirs.state_dict())
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(2, B, T, P, generator=generator) * 3  # cells reach the clip
    masks = torch.arange(T) < torch.tensor([[T, 2, 0, 1], [1, T, 3, 0]]).unsqueeze(-1)
    (outputs, states) = run_both_directions(compiled, inputs, masks, (None, None))
    for index, stack in enumerate(reference):
        ref_outputs, ref_state = stack(inputs[index], masks[index])
        for output, ref_output in zip(outputs[index], ref_outputs, strict=True):
            torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-5)
        torch.testing.assert_close(states[index].c, ref_state.c, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_training_steps_replayed_as_cuda_graphs_equal_the_fused_ones():
    """Captured graphs replayed across steps, the LSTM state carried between them, backward and
    Adagrad in between: the same weights as the fused ops launched kernel by kernel."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    models = []
    for impl in ("fused", "graphed"):
        config = tiny().model_copy(update={"lstm_impl": impl, "batch_directions": True})
        torch.manual_seed(0)
        models.append(BiLM(config, vocab_size=100).to(device).train())
    steps = [
        TrainingStep.build(model, TrainConfig(batch_size=4, unroll_steps=5)) for model in models
    ]
    width = tiny().char_cnn.max_chars_per_token
    states: list = [None, None]
    for seed in range(6):  # warm-up, capture, then replays
        generator = torch.Generator().manual_seed(seed)
        windows = {
            f"{name}_inputs": torch.randint(1, 262, (4, 5, width), generator=generator).to(device)
            for name in ("forward", "backward")
        } | {
            f"{name}_targets": torch.randint(0, 100, (4, 5), generator=generator).to(device)
            for name in ("forward", "backward")
        }
        for index, step in enumerate(steps):
            torch.manual_seed(seed)  # the same dropout masks and candidates
            states[index] = step(**windows, state=states[index]).state
    for (name, graphed), fused in zip(
        models[1].named_parameters(), models[0].parameters(), strict=True
    ):
        torch.testing.assert_close(graphed, fused, rtol=1e-4, atol=1e-5, msg=name)


def test_the_config_selects_it_with_the_reference_parameters():
    config = tiny().model_copy(update={"lstm_impl": "compiled"})
    model = BiLM(config, vocab_size=100)
    assert isinstance(model.forward_lstm, CompiledProjectedLSTM)
    assert model.state_dict().keys() == BiLM(tiny(), vocab_size=100).state_dict().keys()


def _both_directions(variant, batch_directions: bool, inputs, masks):
    """Each direction's layer outputs and new state: together, or each stack alone."""
    torch.manual_seed(0)
    stacks = (variant(CLIPPED, P), variant(CLIPPED, P))
    if batch_directions:
        return run_both_directions(stacks, inputs, masks, (None, None))
    results = [stack(inputs[index], masks[index]) for index, stack in enumerate(stacks)]
    return tuple(zip(*results, strict=True))


_INPUTS = torch.randn(2, B, T, P, generator=torch.Generator().manual_seed(1))
_MASKS = torch.arange(T) < torch.tensor([[T, 2, 0, 1], [1, T, 3, 0]]).unsqueeze(-1)


@pytest.mark.parametrize("batch_directions", [False, True])
def test_without_grad_the_graphed_stack_runs_the_fused_ops_uncaptured(batch_directions):
    """No CUDA graphs without a backward to come: each call would overwrite the previous one's
    outputs, which the next layer's residual still reads."""
    graphed = GraphedProjectedLSTM(CLIPPED, P)
    assert graphed.layer_loop() is lstm_graphed.graphed_layer()
    with torch.no_grad():
        assert graphed.layer_loop() is lstm_fused.fused_layer
        outputs, states = _both_directions(GraphedProjectedLSTM, batch_directions, _INPUTS, _MASKS)
        ref_outputs, ref_states = _both_directions(
            FusedProjectedLSTM, batch_directions, _INPUTS, _MASKS
        )
    torch.testing.assert_close((outputs, states), (ref_outputs, ref_states), rtol=0, atol=0)


@pytest.mark.parametrize("batch_directions", [False, True])
def test_without_grad_the_graphed_stack_reads_no_overwritten_output(batch_directions):
    with emulate_graph_replays(), torch.no_grad():
        _both_directions(GraphedProjectedLSTM, batch_directions, _INPUTS, _MASKS)


def test_the_emulated_replays_fail_a_read_of_an_output_after_the_next_replay():
    """The control: the check catches what cudagraph trees raise on a GPU."""
    layer = ProjectedLSTMLayer(P, H, P, CLIPPED.cell_clip, CLIPPED.proj_clip)
    state = (torch.zeros(B, P), torch.zeros(B, H))
    args = (_INPUTS[0], _MASKS[0], *state, layer.weights(), layer.cell_clip, layer.proj_clip)
    with emulate_graph_replays(), torch.no_grad():
        loop = lstm_graphed.graphed_layer()
        first, _, _ = loop(*args)
        first + 1  # read before the next replay: still the graph's output
        loop(*args)  # no backward pending: a new generation, over the first call's outputs
        with pytest.raises(RuntimeError, match=f"^{OVERWRITTEN}"):
            first + 1
