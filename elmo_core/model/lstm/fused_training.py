"""``elmo::lstm_layer``: a layer's step loop as one op with its own backward, for training.

The forward keeps only what the backward reads. Both ops have fake implementations, so
``torch.compile`` keeps them whole; they run below autocast. The backward carries its gradients in
at least float32, runs its GEMMs as :func:`_backward_gemms` says, and returns each gradient in its
input's dtype.

Shape legend: D = 2 directions (or none), B rows, T window, I input width, P projection, H cell.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from elmo_core.model.lstm.fused_steps import (
    Step,
    add_product,
    cast,
    grad_steps,
    passes,
    product,
    result_buffers,
    run_steps,
    step_kernels,
)

Tensors9 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Tensors7 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


@torch.library.custom_op("elmo::lstm_layer", mutates_args=())
def lstm_layer(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    bias: Tensor,
    projection_weight: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors9:
    """The recurrence, each step written in place into the buffers the backward reads: returns
    outputs, h, c, then the saved gates, cells, their tanh, projections, and h and c entering
    each step."""
    buffers = _forward_buffers(inputs, h, c, input_weight, projection_weight)
    outputs, final_h, final_c, gates, cells, tanh_cells, projected, h_in, c_in = buffers
    dtype = input_weight.dtype
    steps_first = cast(inputs, dtype).transpose(-3, -2).flatten(-3, -2)  # (…, T·B, I)
    # the input GEMM for all steps, into the gates buffer where each step adds its recurrent part
    add_product(bias, steps_first, input_weight, out=gates.flatten(-3, -2))
    h_in.select(-3, 0).copy_(h)
    c_in.select(-3, 0).copy_(c)
    hidden = c_in.new_empty(c.shape, dtype=dtype)  # (…, B, H), each step's
    h_prev, c_prev = h_in.unbind(-3), c_in.unbind(-3)  # T × (…, B, P), T × (…, B, H)
    slices = zip(
        gates.unbind(-3),
        mask.unbind(-1),
        h_prev,
        c_prev,
        (*h_prev[1:], final_h),
        (*c_prev[1:], final_c),
        cells.unbind(-3),
        tanh_cells.unbind(-3),
        [hidden] * len(h_prev),
        projected.unbind(-3),
        outputs.unbind(-2),
        strict=True,
    )
    steps = map(Step._make, slices)
    kernels = step_kernels(gates, c_in)
    run_steps(steps, recurrent_weight, projection_weight, cell_clip, proj_clip, kernels)
    return buffers


@lstm_layer.register_fake
def _(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    bias: Tensor,
    projection_weight: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors9:
    return _forward_buffers(inputs, h, c, input_weight, projection_weight)


def _forward_buffers(
    inputs: Tensor, h: Tensor, c: Tensor, input_weight: Tensor, projection_weight: Tensor
) -> Tensors9:
    """The training forward's results, unfilled: the op fills them, its fake implementation
    returns them. What is saved is time-major, ``(…, T, B, X)``, so that each step's slice is
    one block."""
    cell, projection = projection_weight.shape[-2:]
    *lead, batch, steps = inputs.shape[:-1]
    gemm = input_weight.dtype
    state = torch.promote_types(gemm, c.dtype)

    def per_step(width: int, dtype: torch.dtype) -> Tensor:  # (…, T, B, width)
        return inputs.new_empty((*lead, steps, batch, width), dtype=dtype)

    return (
        *result_buffers(inputs, h, c, input_weight, projection_weight),  # outputs, h, c
        per_step(4 * cell, gemm),  # σ(i), σ(f), tanh(g), σ(o)
        per_step(cell, state),  # cells before the clip
        per_step(cell, state),  # tanh of the clipped cells
        per_step(projection, gemm),  # projections before the clip
        per_step(projection, state),  # h entering each step
        per_step(cell, state),  # c entering each step
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensors9) -> None:
    layer_inputs, mask, h, c, input_weight, recurrent_weight, _, projection_weight, *clips = inputs
    saved = output[3:]
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)  # no zeros for the saved outputs, nor an unused state
    weights = (input_weight, recurrent_weight, projection_weight)
    ctx.save_for_backward(layer_inputs, mask, *weights, *saved)
    ctx.clips = clips
    ctx.state_dtypes = (h.dtype, c.dtype)


def _backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
    result = lstm_layer_backward(*grads[:3], *ctx.saved_tensors, *ctx.clips)
    d_inputs, d_h, d_c, d_input, d_recurrent, d_bias, d_projection = result
    h_dtype, c_dtype = ctx.state_dtypes
    d_state = (cast(d_h, h_dtype), cast(d_c, c_dtype))
    return (d_inputs, None, *d_state, d_input, d_recurrent, d_bias, d_projection, None, None)


lstm_layer.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("elmo::lstm_layer_backward", mutates_args=())
def lstm_layer_backward(
    grad_outputs: Tensor | None,
    grad_h: Tensor | None,
    grad_c: Tensor | None,
    inputs: Tensor,
    mask: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    projection_weight: Tensor,
    gates: Tensor,
    cells: Tensor,
    tanh_cells: Tensor,
    projected: Tensor,
    h_in: Tensor,
    c_in: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors7:
    """The steps walked back once, every step's gate gradients into one tensor; then each weight's
    gradient as one GEMM over all rows. Returns the gradients of inputs, h, c and the weights; a
    missing incoming gradient (an unused output or state) counts as zero."""
    dtype = torch.promote_types(c_in.dtype, torch.float32)  # the carried gradients'
    gemm = _backward_gemms(inputs.device, input_weight.dtype, dtype)  # the GEMMs' operands
    projected, h_in = cast(projected, dtype), cast(h_in, dtype)  # (…, T, B, P)
    keep = mask.transpose(-2, -1).unsqueeze(-1)  # (…, T, B, 1)
    proj_flows = (passes(projected, proj_clip) & keep).to(dtype)  # (…, T, B, P)
    skip = (~keep).to(dtype)  # masked steps pass the state's gradient straight through
    through = (  # the outputs' gradient reaching the projection
        torch.zeros_like(proj_flows)
        if grad_outputs is None
        else cast(grad_outputs, dtype).transpose(-3, -2) * proj_flows
    )  # (…, T, B, P)

    d_gates = gates.new_empty(gates.shape, dtype=gemm)  # (…, T, B, 4H)
    d_projected = torch.empty_like(projected, dtype=gemm)  # (…, T, B, P)
    d_h = _state_grad(grad_h, h_in, dtype)  # (…, B, P)
    d_c = _state_grad(grad_c, c_in, dtype)  # (…, B, H)
    recurrent, projection = (cast(w, gemm).mT for w in (recurrent_weight, projection_weight))
    cell_grad = grad_steps(gates, c_in, tanh_cells, cells, mask, cell_clip, d_gates, d_c)
    # each step's slice, T × (…, B, ·)
    through_at, proj_flows_at, skip_at, d_projected_at, d_gates_at = (
        t.unbind(-3) for t in (through, proj_flows, skip, d_projected, d_gates)
    )
    with torch.autocast(inputs.device.type, enabled=False):
        for t in reversed(range(len(d_gates_at))):
            d_proj = torch.addcmul(through_at[t], d_h, proj_flows_at[t], out=d_projected_at[t])
            cell_grad(t, product(d_proj, projection, out_dtype=dtype))
            from_gates = product(d_gates_at[t], recurrent, out_dtype=dtype)  # (…, B, P)
            torch.addcmul(from_gates, d_h, skip_at[t], out=d_h)

        gate_rows = _rows(d_gates)  # (…, T·B, 4H)
        steps_first = cast(inputs, gemm).transpose(-3, -2)  # (…, T, B, I)
        d_inputs = product(gate_rows, cast(input_weight, gemm).mT).view(steps_first.shape)
        d_input = _weight_grad(_rows(steps_first), gate_rows, input_weight)  # (…, I, 4H)
        d_recurrent = _weight_grad(_rows(cast(h_in, gemm)), gate_rows, recurrent_weight)
        d_bias = gate_rows.sum(-2, keepdim=gate_rows.dim() == 3, dtype=dtype)  # (4H,), (D, 1, 4H)
        out_gate = gates[..., 3 * c_in.shape[-1] :]  # (…, T, B, H), σ(o) as saved
        hidden = _rows(cast(torch.mul(out_gate, tanh_cells), gemm))  # (…, T·B, H)
        d_projection = _weight_grad(hidden, _rows(d_projected), projection_weight)  # (…, H, P)
    weight_dtype = input_weight.dtype
    return (
        cast(d_inputs.transpose(-3, -2).contiguous(), inputs.dtype),  # (…, B, T, I)
        d_h,
        d_c,
        cast(d_input, weight_dtype),
        cast(d_recurrent, weight_dtype),
        cast(d_bias, weight_dtype),
        cast(d_projection, weight_dtype),
    )


@lstm_layer_backward.register_fake
def _(
    grad_outputs: Tensor | None,
    grad_h: Tensor | None,
    grad_c: Tensor | None,
    inputs: Tensor,
    mask: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    projection_weight: Tensor,
    gates: Tensor,
    cells: Tensor,
    tanh_cells: Tensor,
    projected: Tensor,
    h_in: Tensor,
    c_in: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors7:
    dtype = torch.promote_types(c_in.dtype, torch.float32)
    lead = inputs.shape[:-3]
    bias_shape = (*lead, 1, gates.shape[-1]) if lead else (gates.shape[-1],)
    return (
        torch.empty_like(inputs, memory_format=torch.contiguous_format),
        h_in.new_empty((*h_in.shape[:-3], *h_in.shape[-2:]), dtype=dtype),
        c_in.new_empty((*c_in.shape[:-3], *c_in.shape[-2:]), dtype=dtype),
        torch.empty_like(input_weight),
        torch.empty_like(recurrent_weight),
        input_weight.new_empty(bias_shape),
        torch.empty_like(projection_weight),
    )


def _backward_gemms(
    device: torch.device, forward_gemms: torch.dtype, carried: torch.dtype
) -> torch.dtype:
    """The backward GEMMs' operand dtype. On CUDA after a 16-bit forward, that 16-bit type, as
    autocast gives any layer's backward: float32 operands (even on TF32 tensor cores) made the
    backward's GEMMs a third of a step on the H200
    (benchmarks/results/gpu_first_contact-2026-11-27.md). They accumulate in float32, and write
    float32 where a result feeds the carried gradients. Elsewhere the ``carried`` gradients'
    dtype: the CPU has no 16-bit GEMM with a float32 result."""
    if device.type == "cuda" and torch.finfo(forward_gemms).bits < 32:
        return forward_gemms
    return carried


def _rows(x: Tensor) -> Tensor:
    """``(…, T, B, X)`` -> ``(…, T·B, X)``."""
    return x.flatten(-3, -2)


def _state_grad(grad: Tensor | None, saved: Tensor, dtype: torch.dtype) -> Tensor:
    """A fresh ``dtype`` copy of the final state's gradient, to update in place; zero when the
    state went unused. ``saved (…, T, B, X)`` is the state entering each step."""
    if grad is None:
        return saved.new_zeros((*saved.shape[:-3], *saved.shape[-2:]), dtype=dtype)
    return grad.to(dtype, copy=True)


def _weight_grad(x: Tensor, d_out: Tensor, weight: Tensor) -> Tensor:
    """``xᵀ·d_out`` over all rows, laid out as ``weight`` is: a parameter's transposed view gets
    the transposed view of a contiguous gradient, so the parameter's own gradient is contiguous."""
    if weight.mT.is_contiguous():
        return product(d_out.mT, x).mT
    return product(x.mT, d_out)
