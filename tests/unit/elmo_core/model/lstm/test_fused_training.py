"""The fused LSTM layer (one op with its own backward) equals the reference loop."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.config import LSTMConfig, ModelConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import fused_steps
from elmo_core.model.lstm.fused import FusedProjectedLSTM, fused_layer
from elmo_core.model.lstm.fused_inference import lstm_layer_inference
from elmo_core.model.lstm.fused_training import _backward_gemms, lstm_layer, lstm_layer_backward
from elmo_core.model.lstm.reference import ProjectedLSTM, run_layer
from elmo_core.presets import tiny
from tests.unit.elmo_core.model.lstm.fused_cases import (
    CELL_CLIP,
    PROJ_CLIP,
    VOCAB,
    B,
    H,
    I,
    P,
    T,
    _carried_windows,
    _leaves,
    _mask,
    _Ops,
    _training_windows,
    _two_windows,
    _weights,
)


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


@pytest.mark.gpu
@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_on_cuda_the_triton_steps_equal_the_reference_on_the_cpu(directions):
    from elmo_core.model.lstm import triton_kernels as lstm_triton

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
    torch.library.opcheck(lstm_layer, forward)
    torch.library.opcheck(lstm_layer_inference, forward)
    saved = lstm_layer(*forward)[3:]
    input_weight, recurrent, _, projection = _weights(leaves)
    grads = (torch.randn(*lead, B, T, P), None, torch.randn(*lead, B, H))  # h unused
    weights = (input_weight, recurrent, projection)
    backward = (*grads, args[0], mask, *weights, *saved, CELL_CLIP, PROJ_CLIP)
    torch.library.opcheck(lstm_layer_backward, backward)


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
        fused_steps,
        "on_triton",
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


@pytest.mark.parametrize(
    ("device", "forward_gemms", "operands"),
    [
        ("cuda", torch.bfloat16, torch.bfloat16),  # as autocast gives any layer's backward
        ("cuda", torch.float16, torch.float16),
        ("cuda", torch.float32, torch.float32),  # a float32 run stays float32
        ("cpu", torch.bfloat16, torch.float32),  # no 16-bit GEMM with a float32 result there
        ("cpu", torch.float64, torch.float64),  # a float64 run, as the parity tests run
    ],
)
def test_the_backward_gemms_take_16_bit_operands_only_on_cuda_after_a_16_bit_forward(
    device, forward_gemms, operands
):
    carried = torch.promote_types(forward_gemms, torch.float32)
    assert _backward_gemms(torch.device(device), forward_gemms, carried) == operands


class _Gemms(TorchDispatchMode):
    """The operand and result dtypes of each GEMM dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
            self.dtypes.append((args[0].dtype, result.dtype))
        return result


@pytest.mark.skipif(torch.version.cuda is None, reason="fake CUDA tensors need a CUDA build")
@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_on_fake_cuda_the_backward_runs_bf16_gemms_and_carries_float32(directions, monkeypatch):
    """The backward's CUDA path on a CPU (fake tensors on device ``cuda``; its torch steps, as
    Triton's kernels need a GPU): every GEMM takes bf16; the two a step feeding the carried
    gradients write float32, and so do those gradients."""
    monkeypatch.setattr(fused_steps, "on_triton", lambda gates, state: False)
    lead = () if directions is None else (directions,)
    with FakeTensorMode(), torch.device("cuda"):
        bf16 = [x.detach().to("cuda", torch.bfloat16) for x in _leaves(directions)]
        inputs = torch.randn(*lead, B, T, I, dtype=torch.bfloat16)
        mask, h, c = (
            _mask([T, 2, 0, 1], lead).cuda(),
            torch.randn(*lead, B, P),
            torch.randn(*lead, B, H),
        )
        weights = _weights(bf16)
        saved = lstm_layer(inputs, mask, h, c, *weights, CELL_CLIP, PROJ_CLIP)[3:]
        arguments = (torch.randn(*lead, B, T, P), None, torch.randn(*lead, B, H), inputs, mask)
        with _Gemms() as gemms:
            results = lstm_layer_backward._init_fn(
                *arguments, weights.input, weights.recurrent, weights.projection, *saved,
                CELL_CLIP, PROJ_CLIP,
            )  # fmt: skip
    assert {operands for operands, _ in gemms.dtypes} == {torch.bfloat16}
    assert sum(result == torch.float32 for _, result in gemms.dtypes) == 2 * T
    assert [x.dtype for x in results[1:3]] == [torch.float32, torch.float32]  # d_h, d_c
    assert all(x.dtype == torch.bfloat16 for x in results[3:])  # as the weights


@pytest.mark.gpu
@pytest.mark.parametrize("directions", [None, 2], ids=["one-stack", "directions-batched"])
def test_on_cuda_the_bf16_backward_is_within_bf16_rounding_of_float32_gemms(directions):
    """After a bf16 forward, the backward's 16-bit GEMMs on CUDA against float32 GEMMs on the CPU
    over the same saved tensors: each gradient within 1 % (bf16 keeps 8 bits, 0.4 %)."""
    lead = () if directions is None else (directions,)
    generator = torch.Generator().manual_seed(4)
    leaves = [leaf.detach().to(torch.bfloat16) for leaf in _leaves(directions)]
    inputs = torch.randn(*lead, B, T, I, generator=generator).to(torch.bfloat16)
    mask = _mask([T, 2, 0, 1], lead)
    h, c = torch.randn(*lead, B, P), torch.randn(*lead, B, H)
    d_outputs, d_c = torch.randn(*lead, B, T, P).cuda(), torch.randn(*lead, B, H).cuda()
    on_cuda = [x.cuda() for x in (inputs, mask, h, c, *_weights(leaves))]
    saved = lstm_layer(*on_cuda, CELL_CLIP, PROJ_CLIP)[3:]
    inputs, mask, _, _, input_weight, recurrent, _, projection = on_cuda
    backward = (d_outputs, d_c, inputs, mask, input_weight, recurrent, projection, *saved)
    results = []
    for device in ("cuda", "cpu"):  # h's gradient absent: the state went unused
        d_outputs, d_c, *rest = (x.to(device) for x in backward)
        results.append(lstm_layer_backward(d_outputs, None, d_c, *rest, CELL_CLIP, PROJ_CLIP))
    names = ["inputs", "h", "c", "input", "recurrent", "bias", "projection"]
    for got, expected, name in zip(*results, names, strict=True):
        assert got.dtype == expected.dtype, name
        error = (got.cpu().float() - expected.float()).norm() / expected.float().norm()
        assert error < 0.01, (name, error.item())
