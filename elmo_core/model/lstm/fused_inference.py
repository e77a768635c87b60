"""``elmo::lstm_layer_inference``: a layer's step loop where no gradient is taken.

On the CPU step ``k`` runs only the rows with a ``k``-th real token, so padding costs nothing; on
CUDA every row runs every step, masked, as reading lengths back would stall the kernel queue.

Shape legend: D = 2 directions (or none), B rows, T window, I input, P projection, H cell,
N running (row, step) pairs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from elmo_core.model.lstm.fused_steps import (
    Step,
    Tensors3,
    accumulate,
    add_product,
    cast,
    product,
    result_buffers,
    run_steps,
    step_kernels,
    tanh,
)


@torch.library.custom_op("elmo::lstm_layer_inference", mutates_args=())
def lstm_layer_inference(
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
) -> Tensors3:
    """The recurrence with nothing kept for a backward: returns outputs, h and c as
    ``elmo::lstm_layer`` does."""
    layer = (inputs, mask, h, c, input_weight, recurrent_weight, bias, projection_weight)
    results = result_buffers(inputs, h, c, input_weight, projection_weight)
    if _every_step(inputs):
        _infer_every_step(*layer, *results, cell_clip=cell_clip, proj_clip=proj_clip)
    elif mask.dim() == 3 and _lengths_differ(mask):  # then each direction runs alone
        for direction in range(mask.shape[0]):
            parts = (x[direction] for x in (*layer, *results))
            _infer_real_tokens(*parts, cell_clip=cell_clip, proj_clip=proj_clip)
    else:
        _infer_real_tokens(*layer, *results, cell_clip=cell_clip, proj_clip=proj_clip)
    return results


@lstm_layer_inference.register_fake
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
) -> Tensors3:
    return result_buffers(inputs, h, c, input_weight, projection_weight)


def _every_step(inputs: Tensor) -> bool:
    """Whether every row runs every step, masked: on CUDA, where reading the rows' numbers of
    tokens back would stall the queue of kernels, and a GEMM on fewer rows takes about as long.
    (The parity tests patch this to run the Triton kernels on CPU under their interpreter.)"""
    return inputs.is_cuda


def _infer_every_step(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    bias: Tensor,
    projection_weight: Tensor,
    outputs: Tensor,
    final_h: Tensor,
    final_c: Tensor,
    *,
    cell_clip: float | None,
    proj_clip: float | None,
) -> None:
    """The training forward's steps into ``outputs``, ``final_h`` and ``final_c``, the state
    updated in place and each step's cells in one scratch buffer."""
    dtype = input_weight.dtype
    steps_first = cast(inputs, dtype).transpose(-3, -2).flatten(-3, -2)  # (…, T·B, I)
    gates = add_product(bias, steps_first, input_weight)  # (…, T·B, 4H): the input GEMM, once
    final_h.copy_(h)
    final_c.copy_(c)
    cell, tanh_cell = torch.empty_like(final_c), torch.empty_like(final_c)  # (…, B, H)
    hidden = torch.empty_like(final_c, dtype=dtype)  # (…, B, H)
    projection = torch.empty_like(final_h, dtype=dtype)  # (…, B, P)
    state = (final_h, final_c, final_h, final_c, cell, tanh_cell, hidden, projection)
    steps = (
        Step(step_gates, keep, *state, output)
        for step_gates, keep, output in zip(
            gates.unflatten(-2, (inputs.shape[-2], -1)).unbind(-3),  # T × (…, B, 4H)
            mask.unbind(-1),
            outputs.unbind(-2),
            strict=True,
        )
    )
    kernels = step_kernels(gates, final_c)
    run_steps(steps, recurrent_weight, projection_weight, cell_clip, proj_clip, kernels)


def _infer_real_tokens(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    input_weight: Tensor,
    recurrent_weight: Tensor,
    bias: Tensor,
    projection_weight: Tensor,
    outputs: Tensor,
    final_h: Tensor,
    final_c: Tensor,
    *,
    cell_clip: float | None,
    proj_clip: float | None,
) -> None:
    """Each step on the rows still running (:func:`_real_tokens`), none of them masked, the state
    updated in place."""
    dtype = input_weight.dtype
    rows = _real_tokens(mask)
    positions = _take(cast(inputs, dtype).flatten(-3, -2), rows.positions)  # (…, N, I)
    gates = add_product(bias, positions, input_weight)  # (…, N, 4H): the input GEMM, once
    h_state, c_state = (_take(x, rows.order).to(final_c.dtype) for x in (h, c))  # sorted rows
    tanh_cell = torch.empty_like(c_state)  # (…, B, H)
    hidden = torch.empty_like(c_state, dtype=dtype)  # (…, B, H)
    packed = gates.new_empty((*gates.shape[:-1], outputs.shape[-1]))  # (…, N, P)
    width = c.shape[-1]
    for start, end, running in rows.slices():
        step_gates = gates[..., start:end, :]  # (…, n, 4H)
        h_prev, cell = h_state[..., :running, :], c_state[..., :running, :]
        accumulate(step_gates, cast(h_prev, dtype), recurrent_weight)
        in_gate, forget_gate, candidate, out_gate = _activate(step_gates, width)
        cell.mul_(forget_gate).addcmul_(in_gate, candidate)
        if cell_clip is not None:
            cell.clamp_(-cell_clip, cell_clip)
        hidden_now = hidden[..., :running, :]
        torch.mul(out_gate, tanh(cell, out=tanh_cell[..., :running, :]), out=hidden_now)
        output = product(hidden_now, projection_weight, out=packed[..., start:end, :])
        if proj_clip is not None:
            output.clamp_(-proj_clip, proj_clip)
        h_prev.copy_(output)
    _put(outputs.zero_().flatten(-3, -2), rows.positions, packed)  # zero where no row ran
    _put(final_h, rows.order, h_state)
    _put(final_c, rows.order, c_state)


class _RunningRows(NamedTuple):
    """Which rows each step of the inference op runs: the rows sorted by their numbers of real
    tokens, most first, so that those still running at a step are the first few."""

    order: Tensor  # (…, B) int64: the rows in that order
    counts: list[int]  # per step, how many of them run (the same in every direction)
    positions: Tensor  # (…, N) int64: step after step, the position b·T + t each row reads

    def slices(self) -> Iterator[tuple[int, int, int]]:
        """Per step that runs rows: its span of the ``N`` positions, and how many rows."""
        start = 0
        for running in self.counts:
            if running:
                yield start, start + running, running
            start += running


def _real_tokens(mask: Tensor) -> _RunningRows:
    """A masked step passes a row's state through unchanged, so the ``k``-th step may read each
    row's ``k``-th real token, wherever it sits: a row then runs from the first step until its
    tokens are read, never masked, as AllenNLP's ``LstmCellWithProjection`` leaves out the rows
    whose sentence has ended. The directions' rows must have the same numbers of tokens, in some
    order (:func:`_lengths_differ`)."""
    *lead, batch, steps = mask.shape
    lengths = mask.sum(-1)  # (…, B)
    order = lengths.argsort(dim=-1, descending=True, stable=True)  # (…, B)
    sorted_lengths = lengths.gather(-1, order).reshape(-1, batch)[0]  # (B,), every direction's
    counts = (sorted_lengths > torch.arange(steps).unsqueeze(-1)).sum(-1).tolist()  # (T,)
    sorted_mask = mask.gather(-2, order.unsqueeze(-1).expand(*lead, batch, steps))  # (…, B, T)
    rank = sorted_mask.cumsum(-1) - 1  # (…, B, T): which of its row's tokens each one is
    row = torch.arange(batch).unsqueeze(-1)  # (B, 1)
    read_at = torch.where(sorted_mask, rank * batch + row, batch * steps)  # (…, B, T), unique
    picked = read_at.flatten(-2).argsort(-1)[..., : sum(counts)]  # (…, N)
    position = order.unsqueeze(-1) * steps + torch.arange(steps)  # (…, B, T): b·T + t
    return _RunningRows(order, counts, position.flatten(-2).gather(-1, picked))


def _lengths_differ(mask: Tensor) -> bool:
    """Whether the directions' rows ``mask (D, B, T)`` differ in their numbers of tokens, not
    only in their order (then the steps' running rows differ too)."""
    lengths = mask.sum(-1).sort(-1).values  # (D, B)
    return not bool((lengths == lengths[:1]).all())


def _take(x: Tensor, index: Tensor) -> Tensor:
    """``x (…, R, X)`` at the rows ``index (…, N)`` -> ``(…, N, X)``, each direction's own."""
    flat = x.reshape(-1, x.shape[-1]).index_select(0, _flat_rows(index, x.shape[-2]))
    return flat.view(*index.shape, x.shape[-1])


def _put(into: Tensor, index: Tensor, values: Tensor) -> None:
    """``into (…, R, X)`` at the rows ``index (…, N)`` set to ``values (…, N, X)``."""
    flat = values.reshape(-1, values.shape[-1])
    into.view(-1, into.shape[-1]).index_copy_(0, _flat_rows(index, into.shape[-2]), flat)


def _flat_rows(index: Tensor, rows: int) -> Tensor:
    """``index (…, N)`` into each direction's ``rows`` rows, as one index into all of them."""
    starts = torch.arange(index.shape[:-1].numel(), device=index.device) * rows
    return (index + starts.view(*index.shape[:-1], 1)).flatten()


def _activate(gates: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """σ(i), σ(f), tanh(g), σ(o) in place, as views of CPU ``gates (…, n, 4H)``; in float32,
    where ``tanh(g)`` is 2σ(2g) − 1 (:func:`~elmo_core.model.lstm.fused_steps.tanh`), one
    sigmoid takes all four."""
    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, n, H)
    if candidate.dtype != torch.float32:
        gates[..., : 2 * width].sigmoid_()
        torch.tanh(candidate, out=candidate)
        out_gate.sigmoid_()
    else:
        candidate.mul_(2.0)
        gates.sigmoid_()
        candidate.mul_(2.0).sub_(1.0)
    return in_gate, forget_gate, candidate, out_gate
