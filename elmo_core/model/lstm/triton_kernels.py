"""Triton kernels for the pointwise work of a fused step (:mod:`~elmo_core.model.lstm.fused_steps`).

They write the buffers the torch path writes, rounded where it rounds. ``TRITON_INTERPRET=1``
runs them on CPU tensors, so σ and tanh are written with ``exp`` (no libdevice there).

Shape legend: D = 2 directions (or none), B rows, P projection, H cell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only images: the fused ops keep to their torch path, never call in
    AVAILABLE = False
    _jit: Callable[[Any], Any] = lambda fn: fn  # noqa: E731
else:
    AVAILABLE = True
    _jit = triton.jit

BLOCK_ROWS, BLOCK_COLS = 16, 128  # 2048 elements of each gate per program
# 8 warps, 16 elements a thread: with 4, the cell kernel needs 255 registers on sm_90 and spills
# in float32 (infra/device/triton_aot.py, ptxas' account; 8 warps: 154 registers, no spill).
NUM_WARPS = 8
STATE_DTYPES = (torch.float32,)  # the cells' and carried state's dtypes the kernels take
GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cell_step(
    gates: Tensor,
    c_prev: Tensor,
    keep: Tensor,
    cell: Tensor,
    tanh_cell: Tensor,
    hidden: Tensor,
    c_next: Tensor,
    cell_clip: float | None,
) -> None:
    """``gates (…, B, 4H)``, pre-activations in, σ(i), σ(f), tanh(g), σ(o) out; ``c_prev``,
    ``cell`` (before the clip), ``tanh_cell`` (after it), ``hidden`` and ``c_next (…, B, H)``;
    ``keep (…, B)`` the step's mask."""
    _cell_kernel[_grid(c_prev)](
        gates,
        c_prev,
        keep,
        cell,
        tanh_cell,
        hidden,
        c_next,
        *c_prev.shape[-2:],
        _bound(cell_clip),
        *_strides(gates),
        *_strides(c_prev),
        *_strides(keep, rows_dim=-1),
        *_strides(cell),
        *_strides(tanh_cell),
        *_strides(hidden),
        *_strides(c_next),
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
        num_warps=NUM_WARPS,
    )


def projection_step(
    projection: Tensor,
    keep: Tensor,
    h_prev: Tensor,
    h_next: Tensor,
    output: Tensor,
    proj_clip: float | None,
) -> None:
    """``projection``, before the clip, ``h_prev``, ``h_next`` and the step's ``output``, all
    ``(…, B, P)``; ``keep (…, B)`` the step's mask."""
    _projection_kernel[_grid(h_prev)](
        projection,
        keep,
        h_prev,
        h_next,
        output,
        *h_prev.shape[-2:],
        _bound(proj_clip),
        *_strides(projection),
        *_strides(keep, rows_dim=-1),
        *_strides(h_prev),
        *_strides(h_next),
        *_strides(output),
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
        num_warps=NUM_WARPS,
    )


def cell_grad_step(
    d_hidden: Tensor,
    d_c: Tensor,
    d_gates: Tensor,
    gates: Tensor,
    c_prev: Tensor,
    tanh_cell: Tensor,
    cell: Tensor,
    keep: Tensor,
    cell_clip: float | None,
) -> None:
    """The backward's step after the ``d(hidden)`` GEMM, in float32: ``d_c (…, B, H)``, the new
    cell's gradient from later steps in, the entering cell's out; ``d_gates (…, B, 4H)``
    written. Read as the forward saved them: ``gates`` (σ(i), σ(f), tanh(g), σ(o)), ``c_prev``,
    ``tanh_cell`` (after the clip) and ``cell`` (before it); their derivatives are worked out
    here rather than stored for every step."""
    _cell_grad_kernel[_grid(d_c)](
        d_hidden,
        d_c,
        d_gates,
        gates,
        c_prev,
        tanh_cell,
        cell,
        keep,
        *d_c.shape[-2:],
        _bound(cell_clip),
        *_strides(d_hidden),
        *_strides(d_c),
        *_strides(d_gates),
        *_strides(gates),
        *_strides(c_prev),
        *_strides(tanh_cell),
        *_strides(cell),
        *_strides(keep, rows_dim=-1),
        BLOCK_ROWS=BLOCK_ROWS,
        BLOCK_COLS=BLOCK_COLS,
        num_warps=NUM_WARPS,
    )


def _grid(step: Tensor) -> tuple[int, int, int]:
    """One program per tile of one direction's ``(B, X)`` step."""
    *lead, rows, width = step.shape
    return (
        triton.cdiv(rows, BLOCK_ROWS),
        triton.cdiv(width, BLOCK_COLS),
        lead[0] if lead else 1,
    )


def _strides(x: Tensor, rows_dim: int = -2) -> tuple[int, int]:
    """``(direction, row)`` strides of a ``(…, B, X)`` step slice, or of a ``(…, B)`` mask with
    ``rows_dim=-1``; direction 0 where there is none."""
    assert rows_dim == -1 or x.stride(-1) == 1, "a step's last dimension must be contiguous"
    return (x.stride(0) if x.dim() + rows_dim else 0, x.stride(rows_dim))


def _bound(clip: float | None) -> float:
    """The clip as a bound; no clip clamps at infinity."""
    return float("inf") if clip is None else clip


@_jit
def _tile(rows, width, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """This program's tile: the row indices ``(BLOCK_ROWS, 1)``, the column indices
    ``(1, BLOCK_COLS)`` and which of them lie inside the ``(rows, width)`` step."""
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    col = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)[None, :]
    return row, col, (row < rows) & (col < width)


@_jit
def _at(ptr, direction_stride, row_stride, row, col):
    """The addresses of a tile in one direction's ``(B, X)`` step."""
    return ptr + tl.program_id(2) * direction_stride + row * row_stride + col


@_jit
def _load(ptr, direction_stride, row_stride, row, col, inside):
    return tl.load(_at(ptr, direction_stride, row_stride, row, col), mask=inside).to(tl.float32)


@_jit
def _store(ptr, direction_stride, row_stride, row, col, inside, value):
    tl.store(
        _at(ptr, direction_stride, row_stride, row, col),
        value.to(ptr.dtype.element_ty),
        mask=inside,
    )


@_jit
def _rounded(value, ptr):
    """``value`` rounded to the dtype ``ptr`` stores, as the torch path's buffers round it."""
    return value.to(ptr.dtype.element_ty).to(tl.float32)


@_jit
def _sigmoid(x):
    """Not ``tl.sigmoid``: decorated when triton was imported, maybe before ``TRITON_INTERPRET``
    was set, it may not run in the interpreter."""
    return 1.0 / (1.0 + tl.exp(-x))


@_jit
def _tanh(x):
    """``tanh`` from ``exp`` of a non-positive argument, which cannot overflow."""
    e = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -magnitude, magnitude)


@_jit
def _cell_kernel(
    gates,
    c_prev,
    keep,
    cell,
    tanh_cell,
    hidden,
    c_next,
    rows,
    width,
    clip,
    gates_dir,
    gates_row,
    c_prev_dir,
    c_prev_row,
    keep_dir,
    keep_row,
    cell_dir,
    cell_row,
    tanh_dir,
    tanh_row,
    hidden_dir,
    hidden_row,
    c_next_dir,
    c_next_row,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    row, col, inside = _tile(rows, width, BLOCK_ROWS, BLOCK_COLS)
    # the four gates of a cell lie width apart in its row: (i, f, g, o)
    pre_i = _load(gates, gates_dir, gates_row, row, col, inside)
    pre_f = _load(gates, gates_dir, gates_row, row, col + width, inside)
    pre_g = _load(gates, gates_dir, gates_row, row, col + 2 * width, inside)
    pre_o = _load(gates, gates_dir, gates_row, row, col + 3 * width, inside)
    in_gate = _rounded(_sigmoid(pre_i), gates)
    forget_gate = _rounded(_sigmoid(pre_f), gates)
    candidate = _rounded(_tanh(pre_g), gates)
    out_gate = _rounded(_sigmoid(pre_o), gates)
    _store(gates, gates_dir, gates_row, row, col, inside, in_gate)
    _store(gates, gates_dir, gates_row, row, col + width, inside, forget_gate)
    _store(gates, gates_dir, gates_row, row, col + 2 * width, inside, candidate)
    _store(gates, gates_dir, gates_row, row, col + 3 * width, inside, out_gate)

    old = _load(c_prev, c_prev_dir, c_prev_row, row, col, inside)
    new = _rounded(forget_gate * old + in_gate * candidate, cell)
    _store(cell, cell_dir, cell_row, row, col, inside, new)
    new = tl.clamp(new, -clip, clip)
    tanh_new = _rounded(_tanh(new), tanh_cell)
    _store(tanh_cell, tanh_dir, tanh_row, row, col, inside, tanh_new)
    _store(hidden, hidden_dir, hidden_row, row, col, inside, out_gate * tanh_new)
    kept = tl.load(keep + tl.program_id(2) * keep_dir + row * keep_row, mask=row < rows) != 0
    _store(c_next, c_next_dir, c_next_row, row, col, inside, tl.where(kept, new, old))


@_jit
def _projection_kernel(
    projection,
    keep,
    h_prev,
    h_next,
    output,
    rows,
    width,
    clip,
    projection_dir,
    projection_row,
    keep_dir,
    keep_row,
    h_prev_dir,
    h_prev_row,
    h_next_dir,
    h_next_row,
    output_dir,
    output_row,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    row, col, inside = _tile(rows, width, BLOCK_ROWS, BLOCK_COLS)
    new = tl.clamp(_load(projection, projection_dir, projection_row, row, col, inside), -clip, clip)
    old = _load(h_prev, h_prev_dir, h_prev_row, row, col, inside)
    kept = tl.load(keep + tl.program_id(2) * keep_dir + row * keep_row, mask=row < rows) != 0
    _store(h_next, h_next_dir, h_next_row, row, col, inside, tl.where(kept, new, old))
    _store(output, output_dir, output_row, row, col, inside, tl.where(kept, new, 0.0))


@_jit
def _cell_grad_kernel(
    d_hidden,
    d_c,
    d_gates,
    gates,
    c_prev,
    tanh_cell,
    cell,
    keep,
    rows,
    width,
    clip,
    d_hidden_dir,
    d_hidden_row,
    d_c_dir,
    d_c_row,
    d_gates_dir,
    d_gates_row,
    gates_dir,
    gates_row,
    c_prev_dir,
    c_prev_row,
    tanh_dir,
    tanh_row,
    cell_dir,
    cell_row,
    keep_dir,
    keep_row,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    row, col, inside = _tile(rows, width, BLOCK_ROWS, BLOCK_COLS)
    in_gate = _load(gates, gates_dir, gates_row, row, col, inside)
    forget_gate = _load(gates, gates_dir, gates_row, row, col + width, inside)
    candidate = _load(gates, gates_dir, gates_row, row, col + 2 * width, inside)
    out_gate = _load(gates, gates_dir, gates_row, row, col + 3 * width, inside)
    grad_hidden = _load(d_hidden, d_hidden_dir, d_hidden_row, row, col, inside)
    tanh_new = _load(tanh_cell, tanh_dir, tanh_row, row, col, inside)
    # the new cell's gradient: from later steps, and through the hidden state σ(o)·tanh(c)
    grad_c = _load(d_c, d_c_dir, d_c_row, row, col, inside)
    grad_c = grad_c + grad_hidden * (out_gate * (1.0 - tanh_new * tanh_new))
    kept = tl.load(keep + tl.program_id(2) * keep_dir + row * keep_row, mask=row < rows) != 0
    new = _load(cell, cell_dir, cell_row, row, col, inside)
    flows = kept & (tl.abs(new) <= clip)  # where it reaches the gates and the entering cell
    grad_new = tl.where(flows, grad_c, 0.0)
    old = _load(c_prev, c_prev_dir, c_prev_row, row, col, inside)
    d_in = grad_new * (candidate * (1.0 - in_gate) * in_gate)
    d_forget = grad_new * (old * (1.0 - forget_gate) * forget_gate)
    d_candidate = grad_new * (in_gate * (1.0 - candidate * candidate))
    d_out = grad_hidden * (tanh_new * (1.0 - out_gate) * out_gate)
    _store(d_gates, d_gates_dir, d_gates_row, row, col, inside, d_in)
    _store(d_gates, d_gates_dir, d_gates_row, row, col + width, inside, d_forget)
    _store(d_gates, d_gates_dir, d_gates_row, row, col + 2 * width, inside, d_candidate)
    _store(d_gates, d_gates_dir, d_gates_row, row, col + 3 * width, inside, d_out)
    carry = tl.where(flows, forget_gate, tl.where(kept, 0.0, 1.0))  # whole where masked
    _store(d_c, d_c_dir, d_c_row, row, col, inside, grad_c * carry)  # the entering cell's
