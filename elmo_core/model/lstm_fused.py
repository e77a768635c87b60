"""The projected LSTM stack with each layer's step loop run as one op with its own backward.

Autograd through the reference loop records a dozen ops per step and replays their backward one by
one, each step's weight gradients a small GEMM of their own. Here a layer is one op,
``elmo::lstm_layer`` (``torch.library.custom_op``): its forward runs the recurrence of
:func:`~elmo_core.model.lstm.run_layer` into preallocated buffers and keeps only what the backward
reads — the gate activations, the cells before the clip and their tanh after it, the projections
before the clip, and the state entering each step. Its backward, ``elmo::lstm_layer_backward``,
walks the steps back once, writing every step's gate gradients into one ``(…, T, B, 4H)`` tensor,
then takes each weight's gradient as one GEMM over all ``T·B`` rows. Both ops have fake
implementations, so ``torch.compile`` keeps them whole in a compiled step; the parameters, dropout
and residuals are the base class's, and both directions run together (``model.batch_directions``)
as with the reference loop.

Where no gradient is taken (``no_grad``, ``inference_mode``: ``elmo embed``, the pyfunc models,
evaluation), ``elmo::lstm_layer_inference`` runs the same steps keeping nothing: the state is
updated in place and each step's cells in one scratch buffer. On the CPU its ``k``-th step reads
each row's ``k``-th real token, so a step runs only the rows with tokens left, none of them masked,
as AllenNLP's ``LstmCellWithProjection`` leaves out the rows whose sentence has ended: the input
GEMM takes only the real positions, padding costs nothing, and a step needs no mask (and, in
float32, one sigmoid for the four gates).

On CUDA, where triton imports, each step's pointwise work runs in the Triton kernels of
:mod:`~elmo_core.model.lstm_triton` instead of a dozen torch ops: two kernels in the forward, one
each side of the projection GEMM, and one in the backward. :func:`_cell_step` and
:func:`_projection_step` are their torch counterparts, with the same arguments, so both forwards
write the same buffers whichever path runs.

Dtypes are explicit, as custom ops run below autocast: the GEMMs run in the weights' dtype (cast
by :meth:`~elmo_core.model.lstm.LayerWeights.for_autocast`), the cells and the carried state in
that dtype promoted with the state's — what autocast gives the reference loop. The backward runs
in at least float32, autocast or not, and returns each gradient in its input's dtype.

Shape legend: D = 2 directions (or none), B rows, T window, I input width, P projection, H cell,
N running (row, step) pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from elmo_core.model.lstm import LayerLoop, LayerWeights, ProjectedLSTM

Tensors9 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Tensors7 = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
Tensors3 = tuple[Tensor, Tensor, Tensor]


def fused_layer(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    weights: LayerWeights,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors3:
    """:func:`~elmo_core.model.lstm.run_layer` as one op: the same arguments and results; the
    inference op where no gradient can reach the inputs, state or weights."""
    weights = weights.for_autocast()
    arguments = (inputs, mask, h, c, *weights, cell_clip, proj_clip)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (inputs, h, c, *weights)):
        outputs, h, c, *_ = _lstm_layer(*arguments)
        return outputs, h, c
    return _lstm_layer_inference(*arguments)


class FusedProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer's masked step loop run as one op."""

    def layer_loop(self) -> LayerLoop:
        return fused_layer


class _Step(NamedTuple):
    """One step's slices ``(…, n, X)`` of ``n`` rows, for :func:`_run_steps`."""

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


def _run_steps(
    steps: Iterable[_Step],
    recurrent_weight: Tensor,
    projection_weight: Tensor,
    cell_clip: float | None,
    proj_clip: float | None,
    on_triton: bool,
) -> None:
    """The recurrence, each step written into its slices: the recurrent GEMM, the cell's pointwise
    work, the projection GEMM, the projection's; both forwards run their steps here."""
    cell_step, projection_step = _step_kernels(on_triton)
    dtype = recurrent_weight.dtype
    for step in steps:
        _accumulate(step.gates, _cast(step.h_prev, dtype), recurrent_weight)  # (…, n, 4H)
        cell_step(
            step.gates,
            step.c_prev,
            step.keep,
            step.cell,
            step.tanh_cell,
            step.hidden,
            step.c_next,
            cell_clip,
        )
        _product(step.hidden, projection_weight, out=step.projection)  # (…, n, P)
        projection_step(
            step.projection, step.keep, step.h_prev, step.h_next, step.output, proj_clip
        )


def _step_kernels(on_triton: bool) -> tuple[Callable[..., None], Callable[..., None]]:
    """A step's pointwise work, each side of the projection GEMM: in Triton or in torch."""
    if not on_triton:
        return _cell_step, _projection_step
    from elmo_core.model import lstm_triton  # imports triton: only ever on CUDA

    return lstm_triton.cell_step, lstm_triton.projection_step


def _cell_step(
    gates: Tensor,
    c_prev: Tensor,
    keep: Tensor,
    cell: Tensor,
    tanh_cell: Tensor,
    hidden: Tensor,
    c_next: Tensor,
    cell_clip: float | None,
) -> None:
    """:func:`~elmo_core.model.lstm_triton.cell_step` in torch ops, the same slices written."""
    width = c_prev.shape[-1]
    gates[..., : 2 * width].sigmoid_()  # σ(i), σ(f): one sigmoid for both
    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, n, H)
    _tanh(candidate, out=candidate)
    out_gate.sigmoid_()
    torch.mul(forget_gate, c_prev, out=cell).addcmul_(in_gate, candidate)
    new_c = _clip(cell, cell_clip)  # (…, n, H)
    torch.mul(out_gate, _tanh(new_c, out=tanh_cell), out=hidden)
    torch.where(keep.unsqueeze(-1), new_c, c_prev, out=c_next)


def _projection_step(
    projection: Tensor,
    keep: Tensor,
    h_prev: Tensor,
    h_next: Tensor,
    output: Tensor,
    proj_clip: float | None,
) -> None:
    """:func:`~elmo_core.model.lstm_triton.projection_step` in torch ops."""
    new_h = _clip(projection, proj_clip)  # (…, n, P)
    kept = keep.unsqueeze(-1)  # (…, n, 1)
    torch.where(kept, new_h, h_prev, out=h_next)
    torch.mul(new_h, kept, out=output)  # zero where masked


@torch.library.custom_op("elmo::lstm_layer", mutates_args=())
def _lstm_layer(
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
    steps_first = _cast(inputs, dtype).transpose(-3, -2).flatten(-3, -2)  # (…, T·B, I)
    # the input GEMM for all steps, into the gates buffer where each step adds its recurrent part
    _add_product(bias, steps_first, input_weight, out=gates.flatten(-3, -2))
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
    on_triton = _steps_on_triton(gates, c_in)
    steps = map(_Step._make, slices)
    _run_steps(steps, recurrent_weight, projection_weight, cell_clip, proj_clip, on_triton)
    return buffers


def _steps_on_triton(gates: Tensor, state: Tensor) -> bool:
    """Whether the steps' pointwise work runs in :mod:`~elmo_core.model.lstm_triton`'s kernels:
    on CUDA, where triton imports, for the dtypes they take. (The parity tests patch this to run
    them on CPU under the Triton interpreter.)"""
    if not gates.is_cuda:
        return False
    from elmo_core.model import lstm_triton  # imports triton: only ever on CUDA

    return (
        lstm_triton.AVAILABLE
        and gates.dtype in lstm_triton.GEMM_DTYPES
        and state.dtype in lstm_triton.STATE_DTYPES
    )


@_lstm_layer.register_fake
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
        *_inference_buffers(inputs, h, c, input_weight, projection_weight),  # outputs, h, c
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
    result = _lstm_layer_backward(*grads[:3], *ctx.saved_tensors, *ctx.clips)
    d_inputs, d_h, d_c, d_input, d_recurrent, d_bias, d_projection = result
    h_dtype, c_dtype = ctx.state_dtypes
    d_state = (_cast(d_h, h_dtype), _cast(d_c, c_dtype))
    return (d_inputs, None, *d_state, d_input, d_recurrent, d_bias, d_projection, None, None)


_lstm_layer.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("elmo::lstm_layer_backward", mutates_args=())
def _lstm_layer_backward(
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
    dtype = torch.promote_types(c_in.dtype, torch.float32)
    saved = (gates, cells, tanh_cells, projected, h_in, c_in)
    gates, cells, tanh_c, projected, h_in, c_in = (_cast(t, dtype) for t in saved)
    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, T, B, H)
    keep = mask.transpose(-2, -1).unsqueeze(-1)  # (…, T, B, 1)
    cell_flows = _passes(cells, cell_clip) & keep  # where the new cell's gradient reaches the gates
    proj_flows = (_passes(projected, proj_clip) & keep).to(dtype)  # (…, T, B, P)
    # d(pre-activation) of i, f, g = d(new cell) × these; of o = d(hidden) × out_factor
    sigmoid_grad, tanh_grad = torch.ops.aten.sigmoid_backward, torch.ops.aten.tanh_backward
    cell_factors = torch.stack(
        [
            sigmoid_grad(candidate, in_gate),  # tanh(g) · σ'(i)
            sigmoid_grad(c_in, forget_gate),  # c · σ'(f)
            tanh_grad(in_gate, candidate),  # σ(i) · tanh'(g)
        ],
        dim=-2,
    ).mul_(cell_flows.unsqueeze(-2))  # (…, T, B, 3, H)
    out_factor = sigmoid_grad(tanh_c, out_gate)  # tanh(c) · σ'(o)
    hidden_factor = tanh_grad(out_gate, tanh_c)  # d(hidden)/d(new cell): σ(o) · tanh'(c)
    skip = (~keep).to(dtype)  # masked steps pass the state's gradient straight through
    carry = torch.where(cell_flows, forget_gate, skip)  # d(c entering)/d(new cell)
    through = (  # the outputs' gradient reaching the projection
        torch.zeros_like(proj_flows)
        if grad_outputs is None
        else _cast(grad_outputs, dtype).transpose(-3, -2) * proj_flows
    )  # (…, T, B, P)

    d_gates = torch.empty_like(gates)  # (…, T, B, 4H)
    d_projected = torch.empty_like(projected)  # (…, T, B, P)
    d_h = _state_grad(grad_h, h_in)  # (…, B, P)
    d_c = _state_grad(grad_c, c_in)  # (…, B, H)
    d_c_each_gate = d_c.unsqueeze(-2)  # (…, B, 1, H)
    recurrent, projection = (_cast(w, dtype).mT for w in (recurrent_weight, projection_weight))
    cell = c_in.shape[-1]
    on_triton = _steps_on_triton(d_gates, d_c)
    if on_triton:
        from elmo_core.model import lstm_triton
    # each step's slice, T × (…, B, ·)
    through_at, proj_flows_at, hidden_factor_at, out_factor_at, carry_at, skip_at = (
        t.unbind(-3) for t in (through, proj_flows, hidden_factor, out_factor, carry, skip)
    )
    cell_factors_at = cell_factors.unbind(-4)  # T × (…, B, 3, H)
    d_projected_at, d_gates_at = d_projected.unbind(-3), d_gates.unbind(-3)
    d_ifg_at = d_gates[..., : 3 * cell].unflatten(-1, (3, cell)).unbind(-4)  # T × (…, B, 3, H)
    d_o_at = d_gates[..., 3 * cell :].unbind(-3)  # T × (…, B, H)
    # autocast off: the per-step and weight GEMMs in float32 even if called under autocast
    with torch.autocast(inputs.device.type, enabled=False):
        for t in reversed(range(len(d_gates_at))):
            d_proj = torch.addcmul(through_at[t], d_h, proj_flows_at[t], out=d_projected_at[t])
            d_hidden = _product(d_proj, projection)  # (…, B, H)
            if on_triton:  # the four ops below in one kernel
                factors = (cell_factors_at[t], out_factor_at[t], hidden_factor_at[t], carry_at[t])
                lstm_triton.cell_grad_step(d_hidden, d_c, d_gates_at[t], *factors)
            else:
                d_c.addcmul_(d_hidden, hidden_factor_at[t])  # now the new cell's gradient
                torch.mul(d_c_each_gate, cell_factors_at[t], out=d_ifg_at[t])
                torch.mul(d_hidden, out_factor_at[t], out=d_o_at[t])
                d_c.mul_(carry_at[t])  # now the gradient of the c entering the step
            _accumulate(d_h.mul_(skip_at[t]), d_gates_at[t], recurrent)

        gate_rows = _rows(d_gates)  # (…, T·B, 4H)
        steps_first = _cast(inputs, dtype).transpose(-3, -2)  # (…, T, B, I)
        d_inputs = _product(gate_rows, _cast(input_weight, dtype).mT).view(steps_first.shape)
        d_input = _weight_grad(_rows(steps_first), gate_rows, input_weight)  # (…, I, 4H)
        d_recurrent = _weight_grad(_rows(h_in), gate_rows, recurrent_weight)  # (…, P, 4H)
        d_bias = gate_rows.sum(-2, keepdim=gate_rows.dim() == 3)  # (4H,) or (D, 1, 4H)
        hidden = _rows(out_gate * tanh_c)  # (…, T·B, H)
        d_projection = _weight_grad(hidden, _rows(d_projected), projection_weight)  # (…, H, P)
    weight_dtype = input_weight.dtype
    return (
        _cast(d_inputs.transpose(-3, -2).contiguous(), inputs.dtype),  # (…, B, T, I)
        d_h,
        d_c,
        _cast(d_input, weight_dtype),
        _cast(d_recurrent, weight_dtype),
        _cast(d_bias, weight_dtype),
        _cast(d_projection, weight_dtype),
    )


@_lstm_layer_backward.register_fake
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


@torch.library.custom_op("elmo::lstm_layer_inference", mutates_args=())
def _lstm_layer_inference(
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
    results = _inference_buffers(inputs, h, c, input_weight, projection_weight)
    if _every_step(inputs):
        _infer_every_step(*layer, *results, cell_clip=cell_clip, proj_clip=proj_clip)
    elif mask.dim() == 3 and _lengths_differ(mask):  # then each direction runs alone
        for direction in range(mask.shape[0]):
            parts = (x[direction] for x in (*layer, *results))
            _infer_real_tokens(*parts, cell_clip=cell_clip, proj_clip=proj_clip)
    else:
        _infer_real_tokens(*layer, *results, cell_clip=cell_clip, proj_clip=proj_clip)
    return results


@_lstm_layer_inference.register_fake
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
    return _inference_buffers(inputs, h, c, input_weight, projection_weight)


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
    steps_first = _cast(inputs, dtype).transpose(-3, -2).flatten(-3, -2)  # (…, T·B, I)
    gates = _add_product(bias, steps_first, input_weight)  # (…, T·B, 4H): the input GEMM, once
    final_h.copy_(h)
    final_c.copy_(c)
    cell, tanh_cell = torch.empty_like(final_c), torch.empty_like(final_c)  # (…, B, H)
    hidden = torch.empty_like(final_c, dtype=dtype)  # (…, B, H)
    projection = torch.empty_like(final_h, dtype=dtype)  # (…, B, P)
    state = (final_h, final_c, final_h, final_c, cell, tanh_cell, hidden, projection)
    steps = (
        _Step(step_gates, keep, *state, output)
        for step_gates, keep, output in zip(
            gates.unflatten(-2, (inputs.shape[-2], -1)).unbind(-3),  # T × (…, B, 4H)
            mask.unbind(-1),
            outputs.unbind(-2),
            strict=True,
        )
    )
    on_triton = _steps_on_triton(gates, final_c)
    _run_steps(steps, recurrent_weight, projection_weight, cell_clip, proj_clip, on_triton)


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
    positions = _take(_cast(inputs, dtype).flatten(-3, -2), rows.positions)  # (…, N, I)
    gates = _add_product(bias, positions, input_weight)  # (…, N, 4H): the input GEMM, once
    h_state, c_state = (_take(x, rows.order).to(final_c.dtype) for x in (h, c))  # sorted rows
    tanh_cell = torch.empty_like(c_state)  # (…, B, H)
    hidden = torch.empty_like(c_state, dtype=dtype)  # (…, B, H)
    packed = gates.new_empty((*gates.shape[:-1], outputs.shape[-1]))  # (…, N, P)
    width = c.shape[-1]
    for start, end, running in rows.slices():
        step_gates = gates[..., start:end, :]  # (…, n, 4H)
        h_prev, cell = h_state[..., :running, :], c_state[..., :running, :]
        _accumulate(step_gates, _cast(h_prev, dtype), recurrent_weight)
        in_gate, forget_gate, candidate, out_gate = _activate(step_gates, width)
        cell.mul_(forget_gate).addcmul_(in_gate, candidate)
        if cell_clip is not None:
            cell.clamp_(-cell_clip, cell_clip)
        hidden_now = hidden[..., :running, :]
        torch.mul(out_gate, _tanh(cell, out=tanh_cell[..., :running, :]), out=hidden_now)
        output = _product(hidden_now, projection_weight, out=packed[..., start:end, :])
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


def _inference_buffers(
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


def _rows(x: Tensor) -> Tensor:
    """``(…, T, B, X)`` -> ``(…, T·B, X)``."""
    return x.flatten(-3, -2)


def _state_grad(grad: Tensor | None, saved: Tensor) -> Tensor:
    """A fresh float32 (at least) copy of the final state's gradient, to update in place; zero
    when the state went unused. ``saved (…, T, B, X)`` is the state entering each step."""
    if grad is None:
        return saved.new_zeros((*saved.shape[:-3], *saved.shape[-2:]))
    return grad.to(saved.dtype, copy=True)


def _weight_grad(x: Tensor, d_out: Tensor, weight: Tensor) -> Tensor:
    """``xᵀ·d_out`` over all rows, laid out as ``weight`` is: a parameter's transposed view gets
    the transposed view of a contiguous gradient, so the parameter's own gradient is contiguous."""
    if weight.mT.is_contiguous():
        return _product(d_out.mT, x).mT
    return _product(x.mT, d_out)


def _cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype``, with no op dispatched when it already is (most steps, most runs)."""
    return x if x.dtype == dtype else x.to(dtype)


def _tanh(x: Tensor, out: Tensor) -> Tensor:
    """``tanh(x)`` into ``out`` (``x`` itself for in place); on the CPU in float32 as 2σ(2x) − 1,
    as torch's tanh there runs several times slower than its sigmoid. The identity is exact,
    its rounding within 3e-7."""
    if x.is_cuda or x.dtype != torch.float32:
        return torch.tanh(x, out=out)
    return torch.sigmoid(torch.mul(x, 2.0, out=out), out=out).mul_(2.0).sub_(1.0)


def _activate(gates: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """σ(i), σ(f), tanh(g), σ(o) in place, as views of CPU ``gates (…, n, 4H)``; in float32, where
    :func:`_tanh` takes ``tanh(g)`` as 2σ(2g) − 1, one sigmoid takes all four."""
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


def _clip(x: Tensor, clip: float | None) -> Tensor:
    return x if clip is None else x.clamp(-clip, clip)


def _passes(x: Tensor, clip: float | None) -> Tensor:
    """Where the clip lets the gradient through: ``-clip <= x <= clip``, the bounds included, as
    in ``clamp``'s backward."""
    return torch.ones_like(x, dtype=torch.bool) if clip is None else x.abs() <= clip


def _product(x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``x·weight``, batched over the directions when ``x`` is 3-D."""
    return (torch.mm if x.dim() == 2 else torch.bmm)(x, weight, out=out)


def _add_product(base: Tensor, x: Tensor, weight: Tensor, out: Tensor | None = None) -> Tensor:
    """``base + x·weight`` into ``out``, the addition done by the GEMM."""
    return (torch.addmm if x.dim() == 2 else torch.baddbmm)(base, x, weight, out=out)


def _accumulate(base: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """``base += x·weight`` in place."""
    return base.addmm_(x, weight) if x.dim() == 2 else base.baddbmm_(x, weight)
