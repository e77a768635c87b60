"""The output softmax of the biLM: sampled for training, exact (chunked) for evaluation.

Matches bilm-tf's ``sampled_softmax_loss`` with its default log-uniform sampler
(docs/architecture.md, "Sampled softmax").
Both losses run in chunks, of positions or of the vocabulary, so neither the ``N × (1+K)`` nor
the ``N × V`` logits ever exist at once.

Shapes: N positions (rows × window, flattened), P projection, V vocabulary, K sampled, C chunk.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from elmo_core.errors import ConfigError
from elmo_core.model.sampler import LogUniformSampler, SampledCandidates

DEFAULT_CHUNK_SIZE = 16_384
# Bytes of one chunk's float32 (C, K) logits in the sampled loss: at ``original``'s K = 8,192 that
# is C = 8,192 positions, where the whole N = 20,480 of 1,024 rows would take 640 MiB (and
# autograd's copies ~4× that). Each chunk is a dozen launches forward and backward, so the budget
# is bytes, not positions: as many positions per chunk as fit.
SAMPLED_CHUNK_BYTES = 256 * 2**20


def sampled_chunk_size(num_samples: int) -> int:
    """Positions per chunk of the sampled loss with ``num_samples`` candidates."""
    return max(1, SAMPLED_CHUNK_BYTES // (4 * num_samples))


class SoftmaxRows(NamedTuple):
    """The rows of ``W`` and ``b`` one training step reads, gathered once for both directions."""

    ids: torch.Tensor  # (U,) int64, sorted and distinct
    weight: torch.Tensor  # (U, P)
    bias: torch.Tensor  # (U,)

    def select(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of vocabulary ``ids (M,)``, each among ``self.ids``. → (M, P), (M,)."""
        local = torch.searchsorted(self.ids, ids)  # (M,): on the device, no host wait
        return self.weight.index_select(0, local), self.bias.index_select(0, local)


class _GatherRows(torch.autograd.Function):
    """``W[ids]``, ``b[ids]`` whose backward writes only those rows.

    The gradient is built from the known, distinct ``ids``: as a sparse tensor, or dense. Gathered
    with ``F.embedding`` per direction instead, the two directions' sparse gradients would have to
    be re-sorted and merged (``coalesce``, which waits for the GPU) before the exchange, the clip
    and Adagrad could use them.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, weight: torch.Tensor, bias: torch.Tensor, ids: torch.Tensor, sparse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(ids)
        ctx.sparse = sparse
        ctx.weight_shape, ctx.bias_shape = weight.shape, bias.shape
        return weight.index_select(0, ids), bias.index_select(0, ids)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, weight_rows: torch.Tensor | None, bias_rows: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        (ids,) = ctx.saved_tensors
        return (
            _rows_gradient(ids, weight_rows, ctx.weight_shape, ctx.sparse),
            _rows_gradient(ids, bias_rows, ctx.bias_shape, ctx.sparse),
            None,
            None,
        )


def _rows_gradient(
    ids: torch.Tensor, rows: torch.Tensor | None, shape: torch.Size, sparse: bool
) -> torch.Tensor | None:
    if rows is None:
        return None
    if sparse:
        return torch.sparse_coo_tensor(
            ids.unsqueeze(0), rows, shape, is_coalesced=True, check_invariants=False
        )
    return rows.new_zeros(shape).index_copy_(0, ids, rows)


class _SampledCrossEntropy(torch.autograd.Function):
    """Per-position sampled cross-entropy, target at index 0, over chunks of C positions.

    Why a Function: autograd would keep the ``(N, 1+K)`` logits (and their softmax) for the
    backward. Here only each position's target logit and log-partition ``(N,)`` are saved, and
    the backward recomputes each chunk's candidate logits. Whatever is not ``K`` wide (target
    logits, their gradients) is computed once over all positions, and the candidates' cast rows and
    offsets once a step (kept for the backward), so a chunk adds a handful of ops: on CUDA a GEMM
    and one compiled epilogue forward, three GEMMs and one epilogue back. Storing gradients from
    the forward instead is not possible: the candidate rows' and biases' gradients sum over
    positions weighted by the per-position ``grad_output``, so they need the ``(N, K)`` softmax
    until it is known.
    The recompute costs one more ``C × K × P`` GEMM per chunk (four softmax GEMMs instead of
    three); memory is a few ``C × K`` float32 buffers at a time plus a ``(K, P)`` float32
    accumulator.

    Numerics as the whole-logits computation: target logits ``(hidden * rows).sum(-1)`` in the
    rows' dtype, candidate logits and their gradient GEMMs in ``matmul_dtype`` (the autocast dtype
    where autocast would cast them), everything after the GEMMs in float32. One difference under
    autocast: the candidate rows' gradient is the float32 sum of per-chunk bf16 GEMM results, where
    one GEMM over all N rounds its total to bf16 once.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,  # (N, P)
        weights: torch.Tensor,  # (N+K, P): the targets' rows, then the candidates'
        biases: torch.Tensor,  # (N+K,)
        log_q: torch.Tensor,  # (N+K,) float32: log expected counts
        ids: torch.Tensor,  # (N+K,): the targets, then the candidates
        chunk_size: int,
        matmul_dtype: torch.dtype,
    ) -> torch.Tensor:
        num_positions = hidden.shape[0]
        offsets = (
            biases.float() - log_q
        )  # (N+K,): each logit's correction, targets' and candidates'
        candidates = _Candidates(
            weights[num_positions:].to(matmul_dtype),
            offsets[num_positions:],
            ids[num_positions:].unsqueeze(0),
        )
        # every position's corrected target logit, in one pass (only (N, P) wide)
        target = (hidden * weights[:num_positions]).sum(-1).float() + offsets[:num_positions]
        chunk_log_partition = _epilogue(_log_partition, hidden)
        log_partition = torch.cat(  # (N,)
            [
                chunk_log_partition(
                    candidates, hidden[start:end], ids[start:end], target[start:end]
                )
                for start, end in _chunks(num_positions, chunk_size)
            ]
        )
        ctx.save_for_backward(
            hidden, weights, ids, target, log_partition, candidates.rows, candidates.offsets
        )
        ctx.chunk_size, ctx.matmul_dtype, ctx.bias_dtype = chunk_size, matmul_dtype, biases.dtype
        return log_partition - target

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weights, ids, target, log_partition, rows, offsets = ctx.saved_tensors
        num_positions, matmul_dtype = hidden.shape[0], ctx.matmul_dtype
        candidates = _Candidates(rows, offsets, ids[num_positions:].unsqueeze(0))
        scale = grad_output.float()  # (N,)
        # softmax minus one-hot (target at 0), times the position's incoming gradient
        grad_target = torch.expm1(target - log_partition).mul_(scale)  # (N,)
        grad_hidden = (grad_target.unsqueeze(1) * weights[:num_positions]).to(hidden.dtype)
        sums: list[torch.Tensor] = []  # the candidates' rows (K, P) and biases (K,), float32
        chunk_gradient = _epilogue(_candidate_gradient, hidden)
        for start, end in _chunks(num_positions, ctx.chunk_size):
            chunk_hidden = hidden[start:end]  # (C, P)
            grad_candidate, grad_bias = chunk_gradient(
                candidates, chunk_hidden, ids[start:end], log_partition[start:end], scale[start:end]
            )  # (C, K) in the matmul dtype, (K,) float32
            grad_hidden[start:end].add_((grad_candidate @ candidates.rows).to(hidden.dtype))
            chunk_sums = [
                (grad_candidate.t() @ chunk_hidden.to(matmul_dtype)).float(),
                grad_bias,
            ]  # fresh tensors: the first chunk's are the sums (no zero-fill)
            if sums:
                torch._foreach_add_(sums, chunk_sums)
            else:
                sums = chunk_sums
        grad_weights = torch.cat(
            [grad_target.unsqueeze(1) * hidden, sums[0].to(weights.dtype)]
        )  # (N+K, P)
        grad_biases = torch.cat([grad_target, sums[1]]).to(ctx.bias_dtype)  # (N+K,)
        return grad_hidden, grad_weights, grad_biases, None, None, None, None


class _Candidates(NamedTuple):
    """What every chunk's candidate logits share, sliced and cast once a step."""

    rows: torch.Tensor  # (K, P) in the matmul dtype
    offsets: torch.Tensor  # (K,) float32: bias − log expected count
    ids: torch.Tensor  # (1, K)

    def logits(self, chunk: torch.Tensor, chunk_ids: torch.Tensor) -> torch.Tensor:
        """A chunk's corrected candidate logits, the accidental hits at the float32 minimum.
        → (C, K) float32, a buffer of its own (written in place by the caller)."""
        candidate = (chunk.to(self.rows.dtype) @ self.rows.t()).float().add_(self.offsets)
        hits = chunk_ids.unsqueeze(1) == self.ids  # (C, K)
        return candidate.masked_fill_(hits, torch.finfo(torch.float32).min)


def _chunks(num_positions: int, chunk_size: int) -> list[tuple[int, int]]:
    """Each chunk's ``(start, end)`` positions."""
    return [
        (start, min(start + chunk_size, num_positions))
        for start in range(0, num_positions, chunk_size)
    ]


def _log_partition(
    candidates: _Candidates, chunk: torch.Tensor, chunk_ids: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """A chunk's ``logsumexp([target, candidates])``, without concatenating them. → (C,)"""
    return torch.logaddexp(target, torch.logsumexp(candidates.logits(chunk, chunk_ids), dim=1))


def _candidate_gradient(
    candidates: _Candidates,
    chunk: torch.Tensor,
    chunk_ids: torch.Tensor,
    log_partition: torch.Tensor,
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk's loss gradient at its candidate logits (their softmax times each position's
    incoming gradient), in the rows' dtype for the GEMMs, and its float32 sum over positions (the
    candidates' biases). → (C, K), (K,)"""
    grad = (
        candidates.logits(chunk, chunk_ids)
        .sub_(log_partition.unsqueeze(1))
        .exp_()
        .mul_(scale.unsqueeze(1))
    )
    return grad.to(candidates.rows.dtype), grad.sum(0)


def _epilogue(function: Callable[..., Any], hidden: torch.Tensor) -> Callable[..., Any]:
    """``function`` as the chunks of ``hidden`` run it: compiled where :func:`compile_epilogues`
    says so, and else as it is."""
    return _compiled(function) if compile_epilogues(hidden) else function


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` under ``torch.compile``, made on first use: Inductor runs each chunk's
    pointwise work and reductions after the GEMM in one kernel that reads the GEMM's 16-bit output
    once, where eager makes a dozen passes over float32 ``(C, K)`` buffers: 1.19x a step at 1,024
    rows on an H200 (benchmarks/results/gpu_graphed-2026-11-27.md). One compile per chunk shape:
    at most two a run."""
    return torch.compile(function, fullgraph=True, dynamic=False)


def compile_epilogues(hidden: torch.Tensor) -> bool:
    """Whether the sampled loss runs its chunks' epilogues compiled: on CUDA. (A test patches it
    to compare both forms on the CPU.)"""
    return hidden.is_cuda


def _matmul_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype ``hidden @ rows.t()`` would run in here: autocast's, where it casts ``hidden``."""
    device = hidden.device.type
    if (
        torch.amp.is_autocast_available(device)
        and torch.is_autocast_enabled(device)
        and hidden.dtype in (torch.float32, torch.float16, torch.bfloat16)
    ):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


class SampledSoftmax(nn.Module):
    """The biLM's softmax: sampled loss when training, exact negative log likelihood otherwise.

    ``weight (V, P)`` starts as ``N(0, 1/√P)`` and ``bias (V)`` at zero, as in bilm-tf. The BiLM
    calls it once per direction; each training call draws its own candidate set, or takes one drawn
    ahead (off the step's critical path, by the training data loader). Only the rows of the
    candidates and the targets are gathered (:meth:`gather_rows`; once for both directions when
    the loader has found them), so the gradient is row-sparse; ``sparse=True`` returns it as a
    sparse tensor, else dense.
    """

    def __init__(
        self, num_classes: int, dim: int, num_samples: int, *, sparse: bool = False
    ) -> None:
        super().__init__()
        if not 0 < num_samples < num_classes:
            raise ConfigError(
                f"must be in [1, {num_classes - 1}] (always fewer than the vocabulary size "
                f"{num_classes}), got {num_samples}",
                key="model.num_samples",
            )
        self.num_classes = num_classes
        self.dim = dim
        self.num_samples = num_samples
        self.sparse = sparse
        self.sampler = LogUniformSampler(num_classes)
        self.weight = nn.Parameter(torch.empty(num_classes, dim))  # (V, P)
        self.bias = nn.Parameter(torch.empty(num_classes))  # (V,)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=1.0 / math.sqrt(self.dim))
        nn.init.zeros_(self.bias)

    def gather_rows(self, ids: torch.Tensor) -> SoftmaxRows:
        """The rows of ``ids (U,)`` (sorted, distinct), as one node of the graph."""
        weight, bias = _GatherRows.apply(self.weight, self.bias, ids, self.sparse)
        return SoftmaxRows(ids, weight, bias)

    def mark_rows_distinct(self) -> None:
        """Mark the sparse gradients coalesced after a backward through one :meth:`gather_rows`
        (their rows are its ids: sorted, each once), so that nothing sorts them again. Autograd
        drops the mark when it stores a gradient it may take over without a copy."""
        for parameter in (self.weight, self.bias):
            if parameter.grad is not None and parameter.grad.is_sparse:
                parameter.grad._coalesced_(True)

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        generator: torch.Generator | None = None,
        drawn: SampledCandidates | None = None,
        rows: SoftmaxRows | None = None,
    ) -> torch.Tensor:
        """Per-position loss (N,): sampled softmax in training mode, exact NLL in eval mode.

        ``rows``: gathered ahead, holding every target and candidate; else gathered here.
        """
        if not self.training:
            return self.nll(hidden, targets)
        if drawn is None:
            drawn = self.sampler.sample_unique(self.num_samples, generator)
        candidates, num_tries = drawn.ids.to(targets.device, non_blocking=True), drawn.num_tries
        if isinstance(num_tries, torch.Tensor):
            num_tries = num_tries.to(targets.device, non_blocking=True)
        target_counts, candidate_counts = self.sampler.expected_count(
            torch.cat([targets, candidates]), num_tries
        ).split([targets.numel(), candidates.numel()])  # (N,), (K,): one set of launches
        return self.sampled_loss(hidden, targets, candidates, target_counts, candidate_counts, rows)

    def sampled_loss(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        candidates: torch.Tensor,
        target_counts: torch.Tensor,
        candidate_counts: torch.Tensor,
        rows: SoftmaxRows | None = None,
        chunk_size: int | None = None,
    ) -> torch.Tensor:
        """Sampled softmax loss for given candidates and expected counts. → (N,) float32.

        Every logit is corrected by ``−log(expected count)`` (the targets with their own count);
        a candidate equal to a position's target is removed from that position's softmax (TF's
        ``remove_accidental_hits``); the target sits at index 0 of the cross-entropy. ``rows``
        must hold every target and candidate; without them they are found here (``torch.unique``,
        which waits for a GPU). Computed over chunks of ``chunk_size`` positions (by default
        :func:`sampled_chunk_size`'s), forward and backward (:class:`_SampledCrossEntropy`): past
        one chunk the ``N × (1+K)`` logits never exist at once.
        """
        hidden = hidden.to(self.weight.dtype)  # bf16 activations; autocast still applies
        ids = torch.cat([targets, candidates])  # (N+K,)
        if rows is None:
            rows = self.gather_rows(torch.unique(ids))
        weights, biases = rows.select(ids)  # (N+K, P), (N+K,)
        log_q = torch.cat([target_counts, candidate_counts]).log().float()  # (N+K,)
        loss: torch.Tensor = _SampledCrossEntropy.apply(
            hidden,
            weights,
            biases,
            log_q,
            ids,
            chunk_size or sampled_chunk_size(candidates.numel()),
            _matmul_dtype(hidden),
        )
        return loss

    def nll(
        self, hidden: torch.Tensor, targets: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> torch.Tensor:
        """Exact full-softmax negative log likelihood per position. → (N,) float32.

        The log-partition is accumulated over chunks of C classes in float32, so memory is
        ``N × C`` whatever V is. The target's logit is read from the chunk that holds it, so it
        carries the same rounding as the partition (under bf16 autocast the NLL stays ≥ 0).
        """
        hidden = hidden.to(self.weight.dtype)  # bf16 activations; autocast still applies
        num_positions = targets.numel()
        log_partition = hidden.new_full((num_positions,), -math.inf, dtype=torch.float32)
        target_logits = hidden.new_zeros((num_positions,), dtype=torch.float32)
        for start in range(0, self.num_classes, chunk_size):
            end = min(start + chunk_size, self.num_classes)
            weight, bias = self.weight[start:end], self.bias[start:end]  # (C, P), (C,)
            logits = F.linear(hidden, weight, bias).float()  # (N, C)
            log_partition = torch.logaddexp(log_partition, torch.logsumexp(logits, dim=1))
            inside = (targets >= start) & (targets < end)  # (N,)
            local = (targets - start).clamp(0, end - start - 1).unsqueeze(1)  # (N, 1)
            target_logits = torch.where(inside, logits.gather(1, local).squeeze(1), target_logits)
        return log_partition - target_logits
