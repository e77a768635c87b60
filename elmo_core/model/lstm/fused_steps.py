"""What the fused ops share: the forward's step loop, each step's pointwise work forward and
back, small tensor ops.

The pointwise work runs in :mod:`~elmo_core.model.lstm.triton_kernels` on CUDA where triton
imports, else in torch ops that write the same slices; :func:`on_triton` is the one switch.

Shape legend: D = 2 directions (or none), B rows, n running rows, P projection, H cell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import Tensor

Tensors3 = tuple[Tensor, Tensor, Tensor]
StepKernel = Callable[..., None]
GradStep = Callable[[int, Tensor], None]  # (t, d_hidden)


class Step(NamedTuple):
    """One step's slices ``(…, n, X)`` of ``n`` rows, for :func:`run_steps`."""

    gates: Tensor  # (…, n, 4H): the input GEMM's part in, σ(i), σ(f), tanh(g), σ(o) out
    keep: Tensor  # (…, n) bool: the step's mask
    h_prev: Tensor  # (…, n, P): the state entering the step
    c_prev: Tensor  # (…, n, H)
    h_next: Tensor  # (…, n, P): the state leaving it (h_prev itself when updated in place)
    c_next: Tensor  # (…, n, H)
    cell: Tensor  # (…, n, H): the new cell before the clip
    tanh_cell: Tensor  # (…, n, H): its tanh after it
    hidden: Tensor  # (…, n, H): σ(o)·tanh(c), the projection GEMM's input
    projection: Tensor  # (…, n, P): before the clip
    output: Tensor  # (…, n, P): clipped, zero where masked


def run_steps(
    steps: Iterable[Step],
    recurrent_weight: Tensor,
    projection_weight: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    kernels: tuple[StepKernel, StepKernel],
) -> None:
    """The recurrence, each step written into its slices by ``kernels`` (:func:`step_kernels`)."""
    cell_kernel, projection_kernel = kernels
    dtype = recurrent_weight.dtype
    for step in steps:
        accumulate(step.gates, cast(step.h_prev, dtype), recurrent_weight)  # (…, n, 4H)
        cell_kernel(
            step.gates,
            step.c_prev,
            step.keep,
            step.cell,
            step.tanh_cell,
            step.hidden,
            step.c_next,
            cell_clip,
        )
        product(step.hidden, projection_weight, out=step.projection)  # (…, n, P)
        projection_kernel(
            step.projection, step.keep, step.h_prev, step.h_next, step.output, proj_clip
        )


def on_triton(gates: Tensor, state: Tensor) -> bool:
    """Whether the steps' pointwise work runs in the Triton kernels: on CUDA, where triton
    imports, for the dtypes they take. (The parity tests patch this to run them on CPU under the
    Triton interpreter.)"""
    if not gates.is_cuda:
        return False
    from elmo_core.model.lstm.triton_kernels import AVAILABLE, GEMM_DTYPES, STATE_DTYPES

    return AVAILABLE and gates.dtype in GEMM_DTYPES and state.dtype in STATE_DTYPES


def step_kernels(gates: Tensor, state: Tensor) -> tuple[StepKernel, StepKernel]:
    """A step's pointwise work, each side of the projection GEMM: in Triton or in torch."""
    if not on_triton(gates, state):
        return torch_cell_step, torch_projection_step
    import elmo_core.model.lstm.triton_kernels as triton_kernels  # imports triton: CUDA only

    return triton_kernels.cell_step, triton_kernels.projection_step


def grad_steps(
    gates: Tensor,
    c_in: Tensor,
    tanh_cells: Tensor,
    cells: Tensor,
    mask: Tensor,
    cell_clip: float | None,
    d_gates: Tensor,
    d_c: Tensor,
) -> GradStep:
    """The backward's pointwise work of step ``t``, after its ``d(hidden)`` GEMM, over what the
    training forward saved (``(…, T, B, X)``, ``mask (…, B, T)``): ``d_c (…, B, H)``, the new
    cell's gradient from later steps, becomes the entering cell's, and step ``t`` of
    ``d_gates (…, T, B, 4H)`` is written (in its own dtype, worked in ``d_c``'s). Triton's kernel
    works the gates' derivatives out from the saved activations step by step; torch's ops take
    them from tensors computed once for all steps, four ops a step."""
    saved = (gates, c_in, tanh_cells, cells)
    d_gates_at = d_gates.unbind(-3)  # T × (…, B, 4H)
    if on_triton(gates, c_in):
        from elmo_core.model.lstm.triton_kernels import cell_grad_step  # imports triton

        gates_at, c_in_at, tanh_cells_at, cells_at = (x.unbind(-3) for x in saved)
        keep_at = mask.unbind(-1)  # T × (…, B)

        def triton_step(t: int, d_hidden: Tensor) -> None:
            step = (gates_at[t], c_in_at[t], tanh_cells_at[t], cells_at[t], keep_at[t])
            cell_grad_step(d_hidden, d_c, d_gates_at[t], *step, cell_clip)

        return triton_step
    widened = [cast(x, d_c.dtype) for x in saved]
    cell_factors, *factors = _gate_derivatives(widened, mask, cell_clip)
    cell_factors_at = cell_factors.unbind(-4)  # T × (…, B, 3, H)
    out_factor, hidden_factor, carry = (x.unbind(-3) for x in factors)  # T × (…, B, H) each
    width = c_in.shape[-1]
    d_ifg_at = d_gates[..., : 3 * width].unflatten(-1, (3, width)).unbind(-4)  # T × (…, B, 3, H)
    d_o_at = d_gates[..., 3 * width :].unbind(-3)  # T × (…, B, H)
    d_c_each_gate = d_c.unsqueeze(-2)  # (…, B, 1, H)

    def torch_step(t: int, d_hidden: Tensor) -> None:
        d_c.addcmul_(d_hidden, hidden_factor[t])  # now the new cell's gradient
        torch.mul(d_c_each_gate, cell_factors_at[t], out=d_ifg_at[t])
        torch.mul(d_hidden, out_factor[t], out=d_o_at[t])
        d_c.mul_(carry[t])  # now the gradient of the c entering the step

    return torch_step


def _gate_derivatives(
    saved: list[Tensor], mask: Tensor, cell_clip: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For every step at once, from the saved gates, c entering, tanh of the clipped cells and
    the cells, ``(…, T, B, ·)``: the factors that turn the new cell's gradient
    into those of i, f, g (``(…, T, B, 3, H)``) and the hidden state's into o's; the hidden
    state's into the new cell's; the new cell's into the entering cell's."""
    gates, c_in, tanh_cells, cells = saved
    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, T, B, H)
    keep = mask.transpose(-2, -1).unsqueeze(-1)  # (…, T, B, 1)
    flows = passes(cells, cell_clip) & keep  # where the new cell's gradient reaches the gates
    sigmoid_grad, tanh_grad = torch.ops.aten.sigmoid_backward, torch.ops.aten.tanh_backward
    cell_factors = torch.stack(
        [
            sigmoid_grad(candidate, in_gate),  # tanh(g) · σ'(i)
            sigmoid_grad(c_in, forget_gate),  # c · σ'(f)
            tanh_grad(in_gate, candidate),  # σ(i) · tanh'(g)
        ],
        dim=-2,
    ).mul_(flows.unsqueeze(-2))
    out_factor = sigmoid_grad(tanh_cells, out_gate)  # tanh(c) · σ'(o)
    hidden_factor = tanh_grad(out_gate, tanh_cells)  # σ(o) · tanh'(c)
    carry = torch.where(flows, forget_gate, (~keep).to(gates.dtype))  # whole where masked
    return cell_factors, out_factor, hidden_factor, carry


def torch_cell_step(
    gates: Tensor,
    c_prev: Tensor,
    keep: Tensor,
    cell: Tensor,
    tanh_cell: Tensor,
    hidden: Tensor,
    c_next: Tensor,
    cell_clip: float | None,
) -> None:
    """:func:`~elmo_core.model.lstm.triton_kernels.cell_step` in torch ops, the same slices
    written."""
    width = c_prev.shape[-1]
    gates[..., : 2 * width].sigmoid_()  # σ(i), σ(f): one sigmoid for both
    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, n, H)
    tanh(candidate, out=candidate)
    out_gate.sigmoid_()
    torch.mul(forget_gate, c_prev, out=cell).addcmul_(in_gate, candidate)
    new_c = clip(cell, cell_clip)  # (…, n, H)
    torch.mul(out_gate, tanh(new_c, out=tanh_cell), out=hidden)
    torch.where(keep.unsqueeze(-1), new_c, c_prev, out=c_next)


def torch_projection_step(
    projection: Tensor,
    keep: Tensor,
    h_prev: Tensor,
    h_next: Tensor,
    output: Tensor,
    proj_clip: float | None,
) -> None:
    """:func:`~elmo_core.model.lstm.triton_kernels.projection_step` in torch ops."""
    new_h = clip(projection, proj_clip)  # (…, n, P)
    kept = keep.unsqueeze(-1)  # (…, n, 1)
    torch.where(kept, new_h, h_prev, out=h_next)
    torch.mul(new_h, kept, out=output)  # zero where masked


def result_buffers(
    inputs: Tensor, h: Tensor, c: Tensor, input_weight: Tensor, projection_weight: Tensor
) -> Tensors3:
    """The results of either op's forward, unfilled: outputs ``(…, B, T, P)``, h and c."""
    *lead, batch, steps = inputs.shape[:-1]
    state = torch.promote_types(input_weight.dtype, c.dtype)
    return (
        inputs.new_empty(
            (*lead, batch, steps, projection_weight.shape[-1]), dtype=input_weight.dtype
        ),
        h.new_empty(h.shape, dtype=state),
        c.new_empty(c.shape, dtype=state),
    )


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype``, with no op dispatched when it already is (most steps, most runs)."""
    return x if x.dtype == dtype else x.to(dtype)


def tanh(x: Tensor, out: Tensor) -> Tensor:
    """``tanh(x)`` into ``out`` (``x`` itself for in place); on the CPU in float32 as 2σ(2x) − 1,
    as torch's tanh there runs several times slower than its sigmoid. The identity is exact,
    its rounding within 3e-7."""
    if x.is_cuda or x.dtype != torch.float32:
        return torch.tanh(x, out=out)
    return torch.sigmoid(torch.mul(x, 2.0, out=out), out=out).mul_(2.0).sub_(1.0)


def clip(x: Tensor, bound: float | None) -> Tensor:
    return x if bound is None else x.clamp(-bound, bound)


def passes(x: Tensor, bound: float | None) -> Tensor:
    """Where :func:`clip` lets the gradient through: ``-bound <= x <= bound``, the bounds
    included, as in ``clamp``'s backward."""
    return torch.ones_like(x, dtype=torch.bool) if bound is None else x.abs() <= bound


def product(
    x: Tensor, weight: Tensor, out: Tensor | None = None, *, out_dtype: torch.dtype | None = None
) -> Tensor:
    """``x·weight``, batched over the directions when ``x`` is 3-D; in ``out_dtype`` where it
    differs from ``x``'s (float32 from 16-bit operands: CUDA only, and into no ``out``, as only
    that form has a meta kernel for fake tensors)."""
    gemm = torch.mm if x.dim() == 2 else torch.bmm
    if out_dtype is None or out_dtype == x.dtype:
        return gemm(x, weight, out=out)
    assert out is None, "a GEMM with its own result dtype writes a new tensor"
    return gemm(x, weight, out_dtype=out_dtype)


def add_product(base: Tensor, x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``base + x·weight`` into ``out``, the addition done by the GEMM."""
    return (torch.addmm if x.dim() == 2 else torch.baddbmm)(base, x, weight, out=out)


def accumulate(base: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """``base += x·weight`` in place."""
    return base.addmm_(x, weight) if x.dim() == 2 else base.baddbmm_(x, weight)
