"""The Triton step kernels, run on CPU by the Triton interpreter, equal the fused torch path.

``TRITON_INTERPRET`` is read when a kernel is decorated, so it is set only while
:mod:`elmo_core.model.lstm.triton_kernels` is reloaded for these tests, and put back at once; the
module is reloaded again after them, so no other test sees interpreted kernels. The fused op takes
the Triton path on CPU tensors only where a test patches its switch.
"""

import importlib

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the CUDA step kernels are untested")

from elmo_core.model.lstm import fused_steps  # noqa: E402
from elmo_core.model.lstm.fused import fused_layer  # noqa: E402
from elmo_core.model.lstm.fused_training import lstm_layer, lstm_layer_backward  # noqa: E402
from elmo_core.model.lstm.reference import LayerWeights, run_layer  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def lstm_triton():
    """:mod:`triton_kernels` with its kernels decorated under ``TRITON_INTERPRET=1`` for this
    module's tests, then decorated afresh as they would be without it."""
    module = importlib.import_module("elmo_core.model.lstm.triton_kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        importlib.reload(module)
    yield module
    importlib.reload(module)


B, T, I, P, H = 4, 3, 3, 6, 8  # noqa: E741
CELL_CLIP, PROJ_CLIP = 0.5, 0.3  # small: many cells and outputs clipped
LENGTHS = [T, 2, 0, 1]  # padded rows and an empty one
DIRECTIONS = pytest.mark.parametrize("lead", [(), (2,)], ids=["one-stack", "directions-batched"])


@pytest.fixture
def on_triton(monkeypatch):
    """The fused op's step loops through the (interpreted) kernels, on CPU tensors."""
    monkeypatch.setattr(fused_steps, "on_triton", lambda gates, state: True)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _mask(lead: tuple[int, ...]) -> torch.Tensor:
    return (torch.arange(T) < torch.tensor(LENGTHS).unsqueeze(1)).expand(*lead, B, T)


def _clip(x: torch.Tensor, clip: float) -> torch.Tensor:
    return x.clamp(-clip, clip)


@DIRECTIONS
def test_the_cell_kernel_equals_the_torch_step(lead, lstm_triton):
    """On slices laid out as the op's buffers are: the step ``t`` of time-major ``(…, T, B, X)``
    tensors and of the batch-major mask."""
    t = 1
    pre = _randn(*lead, T, B, 4 * H, seed=0, scale=2.0)  # (…, T, B, 4H)
    c_prev = _randn(*lead, T, B, H, seed=1)[..., t, :, :]
    keep = _mask(lead)[..., t]  # (…, B)
    gates = pre.clone()
    cell, tanh_cell, c_next = (torch.full_like(c_prev, float("nan")) for _ in "abc")
    hidden = torch.full_like(c_prev, float("nan"))
    lstm_triton.cell_step(
        gates[..., t, :, :], c_prev, keep, cell, tanh_cell, hidden, c_next, CELL_CLIP
    )

    i, f, g, o = pre[..., t, :, :].chunk(4, dim=-1)
    activations = torch.cat([i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()], dim=-1)
    expected_cell = f.sigmoid() * c_prev + i.sigmoid() * g.tanh()
    new_c = _clip(expected_cell, CELL_CLIP)
    assert (expected_cell.abs() > CELL_CLIP).any() and (expected_cell.abs() < CELL_CLIP).any()
    tol = {"atol": 1e-6, "rtol": 0}
    torch.testing.assert_close(gates[..., t, :, :], activations, **tol)
    torch.testing.assert_close(gates[..., t + 1 :, :, :], pre[..., t + 1 :, :, :], **tol)
    torch.testing.assert_close(cell, expected_cell, **tol)
    torch.testing.assert_close(tanh_cell, new_c.tanh(), **tol)
    torch.testing.assert_close(hidden, o.sigmoid() * new_c.tanh(), **tol)
    torch.testing.assert_close(c_next, torch.where(keep.unsqueeze(-1), new_c, c_prev), **tol)


@DIRECTIONS
def test_the_projection_kernel_equals_the_torch_step(lead, lstm_triton):
    """Into a step of batch-major outputs ``(…, B, T, P)``, and a final state."""
    t = 2
    projection = _randn(*lead, B, P, seed=2)
    h_prev = _randn(*lead, B, P, seed=3)
    keep = _mask(lead)[..., t]  # (…, B)
    outputs = torch.full((*lead, B, T, P), float("nan"))
    h_next = torch.full_like(h_prev, float("nan"))
    lstm_triton.projection_step(projection, keep, h_prev, h_next, outputs[..., t, :], PROJ_CLIP)

    new_h = _clip(projection, PROJ_CLIP)
    assert (projection.abs() > PROJ_CLIP).any() and (projection.abs() < PROJ_CLIP).any()
    keep = keep.unsqueeze(-1)
    torch.testing.assert_close(h_next, torch.where(keep, new_h, h_prev), atol=1e-6, rtol=0)
    torch.testing.assert_close(outputs[..., t, :], new_h * keep, atol=1e-6, rtol=0)
    assert outputs[..., :t, :].isnan().all()  # the other steps untouched


@DIRECTIONS
@pytest.mark.parametrize("gemm", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_cell_gradient_kernel_equals_the_torch_step(lead, gemm, monkeypatch):
    """Over buffers laid out as the training forward saves them (the gates in the GEMMs' dtype),
    many cells clipped and rows masked: the kernel's step ``t``, working the derivatives out as
    it goes, writes the float32 gradients torch's writes from derivatives computed for all
    steps at once."""
    gates = _randn(*lead, T, B, 4 * H, seed=6).tanh().to(gemm)  # (…, T, B, 4H)
    cells = _randn(*lead, T, B, H, seed=7)  # before the clip
    tanh_cells = _clip(cells, CELL_CLIP).tanh()
    c_in = _randn(*lead, T, B, H, seed=8)
    d_hidden, d_c = (_randn(*lead, B, H, seed=s) for s in (9, 10))
    saved = (gates, c_in, tanh_cells, cells, _mask(lead), CELL_CLIP)
    t = 1
    assert (cells[..., t, :, :].abs() > CELL_CLIP).any() and not _mask(lead)[..., t].all()
    expected_d_c, expected_d_gates = d_c.clone(), torch.zeros(*lead, T, B, 4 * H)
    fused_steps.grad_steps(*saved, expected_d_gates, expected_d_c)(t, d_hidden)
    monkeypatch.setattr(fused_steps, "on_triton", lambda gates, state: True)
    d_gates = torch.full((*lead, T, B, 4 * H), float("nan"))
    fused_steps.grad_steps(*saved, d_gates, d_c)(t, d_hidden)

    step = (..., t, slice(None), slice(None))
    torch.testing.assert_close(d_gates[step], expected_d_gates[step], atol=1e-6, rtol=0)
    assert d_gates[..., :t, :, :].isnan().all() and d_gates[..., t + 1 :, :, :].isnan().all()
    torch.testing.assert_close(d_c, expected_d_c, atol=1e-6, rtol=0)


def _layer_arguments(lead: tuple[int, ...], clips: tuple[float | None, float | None]):
    generator = torch.Generator().manual_seed(0)
    shapes = [(4 * H, I), (4 * H, P), (1, 4 * H) if lead else (4 * H,), (P, H)]
    leaves = [torch.randn(*lead, *s, generator=generator).requires_grad_() for s in shapes]
    inputs = torch.randn(*lead, B, T, I, generator=generator).requires_grad_()
    h = torch.randn(*lead, B, P, generator=generator).requires_grad_()
    c = torch.randn(*lead, B, H, generator=generator).requires_grad_()
    input_weight, recurrent, bias, projection = leaves
    weights = LayerWeights(input_weight.mT, recurrent.mT, bias, projection.mT)
    return (inputs, _mask(lead), h, c, weights, *clips), [inputs, h, c, *leaves]


@DIRECTIONS
def test_every_buffer_of_the_op_equals_the_torch_path(lead, monkeypatch):
    """The forward's saved tensors and the backward's results: the backward cannot tell."""
    (inputs, mask, h, c, weights, *clips), _ = _layer_arguments(lead, (CELL_CLIP, PROJ_CLIP))
    arguments = (inputs.detach(), mask, h.detach(), c.detach(), *weights, *clips)
    grads = (_randn(*lead, B, T, P, seed=10), _randn(*lead, B, P, seed=11), None)
    torch_forward = lstm_layer(*arguments)
    torch_backward = lstm_layer_backward(
        *grads, inputs.detach(), mask, weights.input, weights.recurrent, weights.projection,
        *torch_forward[3:], *clips,
    )  # fmt: skip
    monkeypatch.setattr(fused_steps, "on_triton", lambda gates, state: True)
    triton_forward = lstm_layer(*arguments)
    triton_backward = lstm_layer_backward(
        *grads, inputs.detach(), mask, weights.input, weights.recurrent, weights.projection,
        *torch_forward[3:], *clips,
    )  # fmt: skip

    for triton_result, torch_result in zip(
        (*triton_forward, *triton_backward), (*torch_forward, *torch_backward), strict=True
    ):
        torch.testing.assert_close(triton_result, torch_result, atol=1e-6, rtol=0)


@DIRECTIONS
@pytest.mark.parametrize(
    "clips", [(CELL_CLIP, PROJ_CLIP), (None, None)], ids=["clipped", "no-clip"]
)
def test_the_layer_on_triton_equals_the_reference_loop(lead, clips, on_triton):
    """Outputs, final state and every gradient, as :func:`run_layer` gives them."""
    results = []
    for loop in (run_layer, fused_layer):
        arguments, leaves = _layer_arguments(lead, clips)
        outputs, h, c = loop(*arguments)
        scales = [_randn(*x.shape, seed=20 + k) for k, x in enumerate((outputs, h, c))]
        sum((x * s).sum() for x, s in zip((outputs, h, c), scales, strict=True)).backward()
        results.append([outputs, h, c, *(leaf.grad for leaf in leaves)])
    for fused, reference in zip(*results, strict=True):
        torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-5)
