"""Averaging the biLM's gradients across data-parallel workers, the softmax's as sparse rows.

A step touches only the rows of the softmax's ``W (V, P)`` that its candidates and targets name,
but DDP would all-reduce the whole matrix, the model's largest. So the softmax stays out of DDP
and its rows travel apart, one of two ways (``run.grad_exchange``):

- ``union``: the workers agree on the host, before the step, which rows any of them touches (the
  loader found each worker's on the host); each worker places its rows in a block of that union
  and the block is all-reduced, launched as soon as the backward has made the softmax's
  gradients, so that it runs while the LSTMs' backward does. Each row travels once, as NCCL's
  best-kept collective moves it, and nothing is sorted or summed by id on the device.
- ``sparse``: each worker's rows, padded to the most a step can touch, are all-gathered and every
  worker sums them into their union on the device: the baseline, which needs no rows ahead.

Both run alike on gloo and NCCL. Shapes: V vocabulary, P projection, R rows touched on one
worker, M the most rows on any worker, D the rows any worker touches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

ExchangeMode = Literal["union", "sparse", "dense"]
SPARSE_MODES = ("union", "sparse")  # the softmax's gradient as rows
SOFTMAX_PARAMETERS = ("softmax.weight", "softmax.bias")


def exclude_from_ddp(module: nn.Module, names: Iterable[str]) -> None:
    """Tell DDP (before it wraps ``module``) to neither broadcast nor all-reduce these."""
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, list(names)
    )


def dense_gradient_bytes(bilm: nn.Module) -> int:
    """The float32 gradients DDP all-reduces each step: every parameter but the softmax's."""
    return sum(
        p.numel() * 4
        for name, p in bilm.named_parameters()
        if name not in SOFTMAX_PARAMETERS and p.requires_grad
    )


def broadcast_parameters(parameters: Iterable[nn.Parameter], src: int = 0) -> None:
    """Copy ``src``'s values to every worker, as DDP does at wrap time for its own parameters."""
    if not _distributed():
        return
    for parameter in parameters:
        dist.broadcast(parameter.data, src=src)


def softmax_rows_bound(num_classes: int, rows: int, unroll_steps: int, num_samples: int) -> int:
    """The most softmax rows a step can touch: both directions' targets (``rows × unroll_steps``
    each) and candidates, the vocabulary at most. Every worker pads its rows to it for the
    exchange, so its size is static."""
    return min(num_classes, 2 * rows * unroll_steps + 2 * num_samples)


def ring_bytes(collective: Literal["all_reduce", "all_gather"], size: int, world_size: int) -> int:
    """The bytes each worker sends (and receives) when a ring runs ``collective`` on its
    ``size``-byte tensor: ``all_reduce`` reduce-scatters then gathers, ``2(W-1)/W`` of it;
    ``all_gather`` passes on every other worker's, ``(W-1)`` times it."""
    if world_size == 1:
        return 0
    if collective == "all_reduce":
        return 2 * (world_size - 1) * size // world_size
    return (world_size - 1) * size


def agree_on_rows(
    rows: torch.Tensor, num_rows: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """The ``(D,)`` sorted rows any worker touches, from this worker's ``(R,)`` on the host: a byte
    a vocabulary row, maxed over the workers on ``group`` (a host one: nothing waits for a GPU)."""
    marks = torch.zeros(num_rows, dtype=torch.uint8)
    marks[rows] = 1
    dist.all_reduce(marks, op=dist.ReduceOp.MAX, group=group)
    return marks.nonzero().squeeze(1)


class RowsInFlight(NamedTuple):
    """A union exchange launched (:func:`launch_union_exchange`): the agreed ids, the block being
    all-reduced, and the all-reduce's work to wait for."""

    ids: torch.Tensor  # (D,)
    block: torch.Tensor  # (D, P+1)
    work: Any  # torch.distributed's Work


def launch_union_exchange(
    indices: torch.Tensor, rows: torch.Tensor, union: torch.Tensor
) -> RowsInFlight:
    """Start averaging row-sparse gradients over all workers, each worker's ``(R, D)`` rows at its
    ``(R,)`` ids: every worker places them in a ``(|union|, D)`` block at their ids' places in
    the agreed ``union``, and the block's all-reduce is launched, not waited for."""
    slots = torch.searchsorted(union, indices)  # (R,): on the device, no wait
    block = rows.new_zeros(union.numel(), rows.shape[1]).index_copy_(0, slots, rows)
    return RowsInFlight(union, block, dist.all_reduce(block, async_op=True))


def reduce_rows_over_union(
    indices: torch.Tensor, rows: torch.Tensor, union: torch.Tensor
) -> torch.Tensor:
    """The union's ``(|union|, D)`` block of rows averaged over all workers
    (:func:`launch_union_exchange`, waited for)."""
    flight = launch_union_exchange(indices, rows, union)
    flight.work.wait()
    return flight.block.div_(dist.get_world_size())


def launch_softmax_exchange(
    weight: nn.Parameter, bias: nn.Parameter, union: torch.Tensor
) -> RowsInFlight:
    """The union exchange of the softmax's gradients, launched as soon as they exist, so that
    it runs while the rest of the backward does; :func:`exchange_softmax_gradients` finishes it."""
    indices, values, bias_rows = _local_rows(weight, bias)
    packed = torch.cat([values, bias_rows.unsqueeze(1)], dim=1)  # (R, P+1)
    return launch_union_exchange(indices, packed, union)


def exchange_rows(
    indices: torch.Tensor, rows: torch.Tensor, num_rows: int, bound: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Average row-sparse gradients over all workers: ``indices (R,)``, ``rows (R, D)`` per
    worker, ``R ≤ bound``, ids ``< num_rows``.

    Every worker pads to the same static ``bound`` (the most rows a step can touch), so nothing
    is read back to size the exchange, and the union is built in static shapes: the gathered ids
    sorted, each run of one id summed into one slot. Returns ``(W·bound,)`` ids and
    ``(W·bound, D)`` rows divided by the world size: the distinct ids in order, then padding
    slots holding the last row's id with zero rows, which add nothing to a sum, a norm or
    :class:`~elmo_core.training.row_adagrad.RowSparseAdagrad`'s update.
    """
    world_size = dist.get_world_size() if _distributed() else 1
    if world_size == 1:
        return indices, rows
    if indices.numel() > bound:  # a shape: known without waiting for the device
        raise ValueError(f"{indices.numel()} softmax rows, over the static bound {bound}")
    padded_ids = indices.new_full((bound,), num_rows)  # (M,): the padding id sorts last
    padded_ids[: indices.numel()] = indices
    padded_rows = rows.new_zeros(bound, rows.shape[1])  # (M, D)
    padded_rows[: rows.shape[0]] = rows
    all_ids = [torch.empty_like(padded_ids) for _ in range(world_size)]
    all_rows = [torch.empty_like(padded_rows) for _ in range(world_size)]
    dist.all_gather(all_ids, padded_ids)
    dist.all_gather(all_rows, padded_rows)
    distinct, summed = sum_rows_by_id(torch.cat(all_ids), torch.cat(all_rows), num_rows)
    return distinct, summed / world_size


def sum_rows_by_id(
    ids: torch.Tensor, rows: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gathered ``(N,)`` ids and ``(N, D)`` rows as the union in static shapes: the ids sorted,
    each run of one id summed into one slot; the distinct ids in order, then padding slots with
    the last id and zero rows. The exchange's work on the device, which grows with the workers."""
    ids, order = torch.sort(ids)  # (N,)
    values = rows.index_select(0, order)  # (N, D)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[1:] = ids[1:] != ids[:-1]
    slots = torch.cumsum(starts, 0) - 1  # (N,): each id's slot among the distinct ones
    summed = torch.zeros_like(values).index_add_(0, slots, values)
    distinct = torch.full_like(ids, num_rows).scatter_(0, slots, ids)
    return distinct.clamp_(max=num_rows - 1), summed


def exchange_softmax_gradients(
    weight: nn.Parameter,
    bias: nn.Parameter,
    mode: ExchangeMode,
    bound: int,
    union: torch.Tensor | None = None,
    in_flight: RowsInFlight | None = None,
) -> int:
    """Average the softmax's gradients over workers in place; returns the bytes this worker sent
    (and received) for them, as a ring moves them (:func:`ring_bytes`).

    ``union`` and ``sparse``: ``weight.grad`` is a sparse tensor (``SampledSoftmax(sparse=True)``);
    both grads become sparse tensors over the union of touched rows, which ``RowSparseAdagrad``
    applies to those rows only (a zero-gradient row is left unchanged by dense Adagrad too).
    ``union`` all-reduces a block of the agreed ``union`` rows (:func:`agree_on_rows` made it),
    or waits for the exchange already ``in_flight`` (:func:`launch_softmax_exchange`); ``sparse``
    all-gathers each worker's rows padded to ``bound`` (:func:`exchange_rows`). The bias's rows
    travel as one more column of the weight's. ``dense``: both grads become dense and are
    all-reduced whole, the baseline ``benchmarks/bench_train.py`` measures.
    """
    assert weight.grad is not None and bias.grad is not None
    num_classes, dim = weight.shape
    if mode == "dense":
        return _exchange_dense(weight, bias)
    world_size = dist.get_world_size() if _distributed() else 1
    if mode == "union" and world_size > 1:
        if in_flight is None:
            if union is None:
                raise ValueError("the union exchange needs the rows the workers agreed on")
            in_flight = launch_softmax_exchange(weight, bias, union)
        in_flight.work.wait()
        ids, rows = in_flight.ids, in_flight.block.div_(world_size)
        sent = ring_bytes("all_reduce", rows.numel() * rows.element_size(), world_size)
    else:
        indices, values, bias_rows = _local_rows(weight, bias)
        if world_size == 1:  # the average is the gradient: no packing
            weight.grad = _sparse_rows(indices, values, (num_classes, dim))
            bias.grad = _sparse_rows(indices, bias_rows, (num_classes,))
            return 0
        packed = torch.cat([values, bias_rows.unsqueeze(1)], dim=1)  # (R, P+1)
        ids, rows = exchange_rows(indices, packed, num_classes, bound)
        size = bound * (packed.element_size() * packed.shape[1] + indices.element_size())
        sent = ring_bytes("all_gather", size, world_size)
    # contiguous values: a strided column would send the clip's and Adagrad's multi-tensor ops
    # down their one-tensor-at-a-time path on a GPU
    weight.grad = _sparse_rows(ids, rows[:, :dim].contiguous(), (num_classes, dim))
    bias.grad = _sparse_rows(ids, rows[:, dim].contiguous(), (num_classes,))
    return sent


def _local_rows(
    weight: nn.Parameter, bias: nn.Parameter
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This worker's softmax gradient as ``(R,)`` ids, ``(R, P)`` weight rows and ``(R,)`` bias
    rows. Coalescing is no work (and no wait) for the rows ``SampledSoftmax.gather_rows`` made
    once."""
    assert weight.grad is not None and bias.grad is not None
    local = weight.grad.coalesce() if weight.grad.is_sparse else weight.grad.to_sparse(1).coalesce()
    indices = local.indices()[0]  # (R,)
    if bias.grad.is_sparse:  # gathered with the weight's rows: the same rows
        bias_rows = bias.grad.coalesce().values()  # (R,)
        assert bias_rows.shape == indices.shape, "the softmax's weight and bias rows differ"
    else:
        bias_rows = bias.grad[indices]
    return indices, local.values(), bias_rows


def _exchange_dense(weight: nn.Parameter, bias: nn.Parameter) -> int:
    assert weight.grad is not None and bias.grad is not None
    grads = [g.to_dense() if g.is_sparse else g for g in (weight.grad, bias.grad)]
    sent = 0
    if _distributed() and dist.get_world_size() > 1:
        for grad in grads:
            dist.all_reduce(grad)
            grad.div_(dist.get_world_size())
            sent += ring_bytes(
                "all_reduce", grad.numel() * grad.element_size(), dist.get_world_size()
            )
    weight.grad, bias.grad = grads
    return sent


def _sparse_rows(ids: torch.Tensor, values: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    return torch.sparse_coo_tensor(
        ids.unsqueeze(0), values, size, is_coalesced=True, check_invariants=False
    )


def clip_global_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale all gradients by ``max_norm / max(norm, max_norm)`` (TF ``clip_by_global_norm``).

    The norm is over every gradient, sparse ones by their (coalesced) stored rows; returns the norm
    before clipping, as a 0-dim float32 tensor on the gradients' device: nothing waits for the GPU
    here (the scale is always applied; it is exactly 1 when the norm is within ``max_norm``). Run
    it after the exchange, so every worker clips the same averaged gradient. Every gradient, dense
    or a sparse one's stored rows (scaled in place), goes through two multi-tensor ops
    (``_foreach_norm``, ``_foreach_mul_``) rather than a few ops per parameter: on a GPU that is
    two launches where there were ~170 at ``original`` size.
    """
    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return torch.zeros(())
    for parameter in with_grads:
        if parameter.grad is not None and parameter.grad.is_sparse:
            parameter.grad = parameter.grad.coalesce()  # itself when coalesced: no work
    stored = [  # each gradient's stored values: a sparse one's rows are a view of it
        g.values() if g.is_sparse else g for g in (p.grad for p in with_grads) if g is not None
    ]
    norms = torch._foreach_norm(stored)  # one 0-dim norm per gradient
    norm = torch.linalg.vector_norm(torch.stack(norms).float())
    scale = (max_norm / norm).clamp(max=1.0)  # a zero norm gives inf, clamped to 1
    for dtype in {g.dtype for g in stored}:
        torch._foreach_mul_([g for g in stored if g.dtype == dtype], scale.to(dtype))
    return norm


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
