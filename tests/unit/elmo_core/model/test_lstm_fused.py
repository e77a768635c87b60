"""The fused LSTM layer (one op with its own backward) equals the reference loop."""

import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.config import LSTMConfig, ModelConfig
from elmo_core.model import lstm_fused
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import LayerWeights, ProjectedLSTM, run_layer
from elmo_core.model.lstm_fused import (
    FusedProjectedLSTM,
    _lstm_layer,
    _lstm_layer_backward,
    _lstm_layer_inference,
    fused_layer,
)
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids

B, T, I, P, H = 4, 5, 3, 6, 8  # noqa: E741 (the input narrower than P: no transposition hides)
CELL_CLIP, PROJ_CLIP = 0.5, 0.3  # small: many cells and outputs clipped
VOCAB = 100  # more words than tiny's 64 sampled candidates


def _leaves(directions: int | None, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
    """One layer's parameters in their own layout (stacked over the directions when batched),
    large enough that the clips bite."""
    lead = () if directions is None else (directions,)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(4 * H, I), (4 * H, P), (1, 4 * H) if lead else (4 * H,), (P, H)]
    return [
        torch.randn(*lead, *shape, generator=generator).to(device).requires_grad_()
        for shape in shapes
    ]


def _weights(leaves: list[torch.Tensor]) -> LayerWeights:
    """As :meth:`ProjectedLSTMLayer.weights` gives them: the matrices as transposed views."""
    input_weight, recurrent, bias, projection = leaves
    return LayerWeights(input_weight.mT, recurrent.mT, bias, projection.mT)


def _mask(lengths: list[int], lead: tuple[int, ...]) -> torch.Tensor:
    return (torch.arange(T) < torch.tensor(lengths).unsqueeze(1)).expand(*lead, B, T)


def _two_windows(loop, directions: int | None, device: str = "cpu"):
    """Two windows, the second from the first's final state; a weighted loss over both windows'
    outputs and the final state -> outputs, final h and c, and the gradients of every input."""
    lead = () if directions is None else (directions,)
    leaves = _leaves(directions, device=device)
    generator = torch.Generator().manual_seed(1)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    windows = [draw(*lead, B, T, I).requires_grad_() for _ in "ab"]
    h0 = draw(*lead, B, P).requires_grad_()
    c0 = draw(*lead, B, H).requires_grad_()
    masks = [_mask(lengths, lead).to(device) for lengths in ([T, 2, 0, 1], [3, T, 1, 0])]
    output_scales = draw(2, *lead, B, T, P)
    h_scale = draw(*lead, B, P)
    c_scale = draw(*lead, B, H)
    h, c, outputs = h0, c0, []
    for window, mask in zip(windows, masks, strict=True):
        output, h, c = loop(window, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
        outputs.append(output)
    loss = sum((o * s).sum() for o, s in zip(outputs, output_scales, strict=True))
    loss = loss + (h * h_scale).sum() + (c * c_scale).sum()
    grads = torch.autograd.grad(loss, [*windows, h0, c0, *leaves])
    return outputs, h, c, grads, masks


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_outputs_states_and_every_gradient_equal_the_reference_over_two_windows(directions):
    outputs, h, c, grads, masks = _two_windows(fused_layer, directions)
    ref_outputs, ref_h, ref_c, ref_grads, _ = _two_windows(run_layer, directions)

    assert (ref_c.abs() == CELL_CLIP).float().mean() > 0.2  # the clips bite
    assert (ref_outputs[1].abs() == PROJ_CLIP).float().mean() > 0.1
    for output, ref_output, mask in zip(outputs, ref_outputs, masks, strict=True):
        torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-5)
        assert not output[~mask].any()  # zero where masked
    torch.testing.assert_close(h, ref_h, rtol=0, atol=1e-5)
    torch.testing.assert_close(c, ref_c, rtol=0, atol=1e-5)
    names = ["window 1", "window 2", "h0", "c0", "input", "recurrent", "bias", "projection"]
    for grad, ref_grad, name in zip(grads, ref_grads, names, strict=True):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton steps run on CUDA")
@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_on_cuda_the_triton_steps_equal_the_reference_on_the_cpu(directions):
    from elmo_core.model import lstm_triton

    assert lstm_triton.AVAILABLE, "the device image has triton: the Triton path must run"
    outputs, h, c, grads, _ = _two_windows(fused_layer, directions, device="cuda")
    ref_outputs, ref_h, ref_c, ref_grads, _ = _two_windows(run_layer, directions)
    for output, ref_output in zip(outputs, ref_outputs, strict=True):
        torch.testing.assert_close(output.cpu(), ref_output, rtol=0, atol=1e-5)
    torch.testing.assert_close(h.cpu(), ref_h, rtol=0, atol=1e-5)
    torch.testing.assert_close(c.cpu(), ref_c, rtol=0, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad.cpu(), ref_grad, rtol=0, atol=1e-5)
    with torch.inference_mode():
        got = _carried_windows(fused_layer, directions, (CELL_CLIP, PROJ_CLIP), device="cuda")
    for result, expected in zip(got, _carried_windows(run_layer, directions), strict=True):
        torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=1e-5)


def _carried_windows(
    loop, directions: int | None, clips=(CELL_CLIP, PROJ_CLIP), device: str = "cpu"
) -> list[torch.Tensor]:
    """Both windows' outputs and the final h and c of :func:`_two_windows`'s inputs, without
    gradients; batched directions get masks of their own, one with a gap inside a row."""
    lead = () if directions is None else (directions,)
    leaves = [leaf.detach() for leaf in _leaves(directions, device=device)]
    generator = torch.Generator().manual_seed(1)
    windows = [torch.randn(*lead, B, T, I, generator=generator).to(device) for _ in "ab"]
    h = torch.randn(*lead, B, P, generator=generator).to(device)
    c = torch.randn(*lead, B, H, generator=generator).to(device)
    masks = [_mask(lengths, lead).clone() for lengths in ([T, 2, 0, 1], [3, T, 1, 0])]
    if directions is not None:
        masks[0][1] = _mask([1, 0, T, 3], ())
        masks[1][1, 2, 3] = True  # a real token after padding
    outputs = []
    for window, mask in zip(windows, masks, strict=True):
        output, h, c = loop(window, mask.to(device), h, c, _weights(leaves), *clips)
        outputs.append(output)
    return [*outputs, h, c]


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
        lambda *args: _lstm_layer(*args[:4], *args[4], *args[5:])[:3], directions, clips
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
    """The fused ops' steps through :mod:`lstm_triton`'s kernels on CPU tensors, the inference op
    on CUDA's path: decorated under ``TRITON_INTERPRET=1``, as in ``test_lstm_triton.py``, and
    decorated afresh afterwards."""
    pytest.importorskip("triton", reason="triton is not installed")
    module = importlib.import_module("elmo_core.model.lstm_triton")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        importlib.reload(module)
    monkeypatch.setattr(lstm_fused, "_steps_on_triton", lambda gates, state: True)
    monkeypatch.setattr(lstm_fused, "_every_step", lambda inputs: True)
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
    assert not lstm_fused._lengths_differ(mask)
    with torch.inference_mode():
        got = fused_layer(inputs, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
    expected = run_layer(inputs, mask, h, c, _weights(leaves), CELL_CLIP, PROJ_CLIP)
    for result, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(result, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_without_gradients_every_step_in_torch_ops_equals_the_reference(directions, monkeypatch):
    """CUDA's inference path where the Triton kernels do not run, here on the CPU."""
    monkeypatch.setattr(lstm_fused, "_every_step", lambda inputs: True)
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


def test_without_clips_it_equals_the_reference_and_an_empty_row_keeps_its_state():
    leaves = [(0.5 * leaf).detach().requires_grad_() for leaf in _leaves(None)]  # no blow-up
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(B, T, I, generator=generator).requires_grad_()
    h = torch.randn(B, P, generator=generator).requires_grad_()
    c = torch.randn(B, H, generator=generator).requires_grad_()
    mask = _mask([T, 2, 0, 1], ())
    results = []
    for loop in (fused_layer, run_layer):
        outputs, new_h, new_c = loop(inputs, mask, h, c, _weights(leaves), None, None)
        loss = outputs.sum() + (new_h * 2).sum() + (new_c * 3).sum()
        grads = torch.autograd.grad(loss, [inputs, h, c, *leaves])
        results.append((outputs, new_h, new_c, *grads))
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    _, new_h, new_c, *_ = results[0]
    assert torch.equal(new_h[2], h[2]) and torch.equal(new_c[2], c[2])  # the empty row


def test_at_the_clip_bounds_the_gradient_passes_as_through_clamp():
    """Candidates tanh(0) = 0 from a zero state keep every cell at exactly 0, so every projection
    is exactly 0 too: with both clips 0, each sits on its bound, where ``clamp`` passes the
    gradient."""
    leaves = _leaves(None)
    with torch.no_grad():
        for leaf in leaves[:3]:  # input, recurrent, bias
            leaf[2 * H : 3 * H] = 0.0  # the candidate's rows
    inputs, mask = torch.randn(B, T, I).requires_grad_(), _mask([T, 2, 0, 1], ())
    h, c = torch.randn(B, P), torch.zeros(B, H)
    grads = []
    for loop in (fused_layer, run_layer):
        outputs, _, _ = loop(inputs, mask, h, c, _weights(leaves), 0.0, 0.0)
        weights = torch.randn_like(outputs, generator=torch.Generator().manual_seed(2))
        grads.append(torch.autograd.grad((outputs * weights).sum(), [inputs, *leaves]))
    assert grads[1][1][2 * H : 3 * H].abs().sum() > 0  # it reached the candidate's weights
    for grad, ref_grad in zip(*grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_the_ops_fake_implementations_and_autograd_registration_pass_opcheck(directions):
    lead = () if directions is None else (directions,)
    leaves = [leaf.detach() for leaf in _leaves(directions)]
    mask = _mask([T, 2, 0, 1], lead)
    args = (torch.randn(*lead, B, T, I), mask, torch.randn(*lead, B, P), torch.randn(*lead, B, H))
    forward = (*args, *_weights(leaves), CELL_CLIP, PROJ_CLIP)
    torch.library.opcheck(_lstm_layer, forward)
    torch.library.opcheck(_lstm_layer_inference, forward)
    saved = _lstm_layer(*forward)[3:]
    input_weight, recurrent, _, projection = _weights(leaves)
    grads = (torch.randn(*lead, B, T, P), None, torch.randn(*lead, B, H))  # h unused
    weights = (input_weight, recurrent, projection)
    backward = (*grads, args[0], mask, *weights, *saved, CELL_CLIP, PROJ_CLIP)
    torch.library.opcheck(_lstm_layer_backward, backward)


def test_a_compiled_function_calling_it_runs_whole_and_matches_eager():
    """``fullgraph``: Dynamo and AOTAutograd take both ops by their fake implementations."""
    single, batched = _leaves(None), _leaves(2, seed=1)
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(B, T, I, generator=generator), torch.randn(2, B, T, I)]
    inputs = [x.requires_grad_() for x in inputs]
    masks = [_mask([T, 2, 0, 1], ()), _mask([3, T, 1, 0], (2,))]

    def loss(x, x2, *leaves):
        out, h, _ = fused_layer(
            x, masks[0], torch.zeros(B, P), torch.zeros(B, H), _weights(leaves[:4]), 0.5, 0.3
        )
        out2, _, c2 = fused_layer(
            x2, masks[1], h.expand(2, B, P), torch.ones(2, B, H), _weights(leaves[4:]), 0.5, 0.3
        )
        return (out * out).sum() + out2.sum() + c2.sum()

    parameters = [*inputs, *single, *batched]
    expected = loss(*parameters)
    expected_grads = torch.autograd.grad(expected, parameters)
    got = torch.compile(loss, fullgraph=True)(*parameters)
    grads = torch.autograd.grad(got, parameters)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


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


def _training_windows(width: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
        torch.randint(1, 262, (3, 4, width), generator=generator),
        torch.randint(0, VOCAB, (3, 4), generator=generator),
    ]


@pytest.mark.parametrize("batch_directions", [False, True])
def test_the_bilm_scores_and_learns_as_with_the_reference_loop(batch_directions):
    config = tiny().model_copy(update={"batch_directions": batch_directions})
    torch.manual_seed(0)
    reference = BiLM(config.model_copy(update={"lstm_impl": "reference"}), vocab_size=VOCAB).train()
    fused = BiLM(config.model_copy(update={"lstm_impl": "fused"}), vocab_size=VOCAB).train()
    assert isinstance(fused.forward_lstm, FusedProjectedLSTM)
    fused.load_state_dict(reference.state_dict())  # the same parameters, key for key
    windows = _training_windows(config.char_cnn.max_chars_per_token)
    results = []
    for model in (fused, reference):
        torch.manual_seed(5)  # the same dropout masks and sampled candidates
        output, _ = model.training_loss(*windows)
        output.loss.backward()
        results.append((output.loss, [p.grad for p in model.parameters()]))
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for (name, _), grad, ref_grad in zip(fused.named_parameters(), grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_under_bf16_autocast_the_carried_state_stays_float32_for_the_triton_steps(
    impl, monkeypatch
):
    """The GEMMs run in bf16 but the cells and the state carried between windows in float32,
    the dtype the Triton steps take: a bf16 state would send every training step on CUDA down
    the torch path."""
    config = tiny().model_copy(update={"lstm_impl": impl, "batch_directions": True})
    model = BiLM(config, vocab_size=VOCAB).train()
    seen = []
    monkeypatch.setattr(  # records what the Triton dispatch is asked about, and answers as on CPU
        lstm_fused,
        "_steps_on_triton",
        lambda gates, state: seen.append((gates.dtype, state.dtype)) and False,
    )
    windows = _training_windows(config.char_cnn.max_chars_per_token)
    state = None
    with torch.autocast("cpu", torch.bfloat16):
        for _ in range(2):  # the second window from the carried state
            output, state = model.training_loss(*windows, state=state)
    output.loss.backward()
    assert {part.dtype for stack in state for part in stack} == {torch.float32}
    if impl == "fused":
        assert {state for _, state in seen} == {torch.float32}  # forward and backward
        assert (torch.bfloat16, torch.float32) in seen  # the forward's GEMMs in bf16


def test_the_config_takes_it_with_directions_batched():
    settings = {**tiny().model_dump(), "lstm_impl": "fused", "batch_directions": True}
    assert ModelConfig.model_validate(settings).lstm_impl == "fused"


class _Ops(TorchDispatchMode):
    """Counts the ops dispatched, those the fused layer's own ops run included: in eager mode on a
    GPU, each is about one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.elmo: list[str] = []  # the fused layer's own ops, by name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        kwargs = kwargs or {}
        if func.namespace == "elmo":  # run its implementation with this mode still counting
            self.elmo.append(func._opname)
            with self:
                cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
                return func.redispatch(cpu, *args, **kwargs)
        return func(*args, **kwargs)


def test_a_fused_stack_dispatches_far_fewer_ops_forward_and_backward():
    config = LSTMConfig(cell_dim=H, projection_dim=P, num_layers=2, cell_clip=0.5, proj_clip=0.4)
    window = 20  # bilm-tf's unroll: the step loop dominates
    inputs = torch.randn(B, window, P).requires_grad_()
    mask = torch.ones(B, window, dtype=torch.bool)
    counts = []
    for variant in (ProjectedLSTM, FusedProjectedLSTM):
        torch.manual_seed(0)
        stack = variant(config, P)
        with _Ops() as ops:
            outputs, _ = stack(inputs, mask)
            sum(output.sum() for output in outputs).backward()
        counts.append(ops.count)
    reference, fused = counts
    assert fused < 0.5 * reference, counts  # 1,095 against 3,065 when written
