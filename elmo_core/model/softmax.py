"""The output softmax of the biLM: sampled for training, exact (chunked) for evaluation.

Matches bilm-tf (DESIGN.md §3): one ``W (V, P)``, ``b (V)`` shared by both directions; training
uses ``tf.nn.sampled_softmax_loss`` with its default sampler, ``log_uniform_candidate_sampler(
unique=True)``, ``subtract_log_q=True`` and ``remove_accidental_hits=True``; perplexity uses the
full softmax, computed over chunks of the vocabulary so ``N × V`` logits never exist at once.

Shapes: N positions (rows × window, flattened), P projection, V vocabulary, K sampled, C chunk.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from elmo_core.errors import ConfigError

DEFAULT_CHUNK_SIZE = 16_384


class LogUniformSampler:
    """Zipf sampler over ids in frequency order: ``P(k) = log((k+2)/(k+1)) / log(V+1)``.

    The formula, the inverse-CDF draw ``floor(exp(u·log(V+1))) − 1`` and the unique-sampling
    expected count follow TF's ``LogUniformSampler`` (``range_sampler.cc``).
    """

    def __init__(self, num_classes: int) -> None:
        if num_classes < 2:
            raise ConfigError(f"needs at least 2 classes, got {num_classes}", key="vocab")
        self.num_classes = num_classes
        self._log_range = math.log(num_classes + 1)

    def probability(self, ids: torch.Tensor) -> torch.Tensor:
        """``P(k)`` for each id, in float64 (the smallest is about ``1 / (V² log V)``)."""
        ids = ids.to(torch.float64)
        return torch.log1p(1.0 / (ids + 1.0)) / self._log_range

    def draw(self, num_draws: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``num_draws`` ids drawn with replacement. → (num_draws,) int64."""
        device = generator.device if generator is not None else torch.device("cpu")
        u = torch.rand(num_draws, generator=generator, dtype=torch.float64, device=device)
        ids = torch.floor(torch.exp(u * self._log_range)).long() - 1  # (num_draws,)
        return ids.clamp_(0, self.num_classes - 1)  # guards float rounding at u → 1

    def sample_unique(
        self, num_samples: int, generator: torch.Generator | None = None
    ) -> SampledCandidates:
        """``num_samples`` distinct ids and the number of draws it took (TF ``unique=True``).

        Draws with replacement until ``num_samples`` distinct ids have appeared; the candidates
        are in order of first appearance and ``num_tries`` counts every draw up to and including
        the last new one. Draws are made in vectorised batches; the count is exact.
        """
        if not 0 < num_samples < self.num_classes:
            raise ConfigError(
                f"must be in [1, {self.num_classes - 1}] (always fewer than the vocabulary "
                f"size {self.num_classes}), got {num_samples}",
                key="model.num_samples",
            )
        draws = torch.empty(0, dtype=torch.long)
        batch = 2 * num_samples
        while True:
            draws = torch.cat([draws, self.draw(batch, generator).cpu()])  # (D,)
            is_new = _first_occurrences(draws)  # (D,)
            num_distinct = torch.cumsum(is_new, 0)  # (D,)
            if int(num_distinct[-1]) >= num_samples:
                num_tries = int(torch.searchsorted(num_distinct, num_samples)) + 1
                candidates = draws[:num_tries][is_new[:num_tries]]  # (K,)
                return SampledCandidates(candidates, num_tries)
            batch *= 2

    def expected_count(self, ids: torch.Tensor, num_tries: int) -> torch.Tensor:
        """``1 − (1 − P(k))^num_tries``: how often ``k`` is expected among the unique draws.

        Computed as ``−expm1(num_tries · log1p(−P))`` in float64 (as TF does). TF takes a
        shortcut, ``P(k) · K``, when no draw repeated (``num_tries == K``); for a real vocabulary
        that case has vanishing probability, so the one formula is used throughout.
        """
        p = self.probability(ids)
        return -torch.expm1(num_tries * torch.log1p(-p))


def _first_occurrences(values: torch.Tensor) -> torch.Tensor:
    """True where an element appears for the first time in ``values``. → (D,) bool."""
    _, inverse = torch.unique(values, return_inverse=True)
    positions = torch.arange(values.numel())
    first = torch.full((int(inverse.max()) + 1,), values.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    return first[inverse] == positions


class SampledCandidates(NamedTuple):
    """One training call's candidate set, drawn by :meth:`LogUniformSampler.sample_unique`."""

    ids: torch.Tensor  # (K,) int64, distinct
    num_tries: int  # draws it took, for the expected counts


class SampledSoftmax(nn.Module):
    """The biLM's softmax: sampled loss when training, exact negative log likelihood otherwise.

    ``weight (V, P)`` starts as ``N(0, 1/√P)`` and ``bias (V)`` at zero, as in bilm-tf. The BiLM
    calls it once per direction; each training call draws its own candidate set, or takes one drawn
    ahead (off the step's critical path, by the training data loader). Only the rows of
    ``weight`` for the candidates and the targets are gathered (``F.embedding``), so its gradient
    is row-sparse; ``sparse=True`` returns it as a sparse tensor.
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

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        generator: torch.Generator | None = None,
        drawn: SampledCandidates | None = None,
    ) -> torch.Tensor:
        """Per-position loss (N,): sampled softmax in training mode, exact NLL in eval mode."""
        if not self.training:
            return self.nll(hidden, targets)
        if drawn is None:
            drawn = self.sampler.sample_unique(self.num_samples, generator)
        candidates, num_tries = drawn.ids.to(targets.device, non_blocking=True), drawn.num_tries
        return self.sampled_loss(
            hidden,
            targets,
            candidates,
            self.sampler.expected_count(targets, num_tries),  # (N,)
            self.sampler.expected_count(candidates, num_tries),  # (K,)
        )

    def sampled_loss(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        candidates: torch.Tensor,
        target_counts: torch.Tensor,
        candidate_counts: torch.Tensor,
    ) -> torch.Tensor:
        """Sampled softmax loss for given candidates and expected counts. → (N,) float32.

        Every logit is corrected by ``−log(expected count)`` (the targets with their own count);
        a candidate equal to a position's target is removed from that position's softmax (TF's
        ``remove_accidental_hits``); the target sits at index 0 of the cross-entropy.
        """
        hidden = hidden.to(self.weight.dtype)  # bf16 activations; autocast still applies
        ids = torch.cat([targets, candidates])  # (N+K,)
        rows = F.embedding(ids, self.weight, sparse=self.sparse)  # (N+K, P)
        biases = self.bias.index_select(0, ids)  # (N+K,)
        num_positions = targets.numel()
        target_rows, candidate_rows = rows[:num_positions], rows[num_positions:]
        target_logits = (hidden * target_rows).sum(-1).float()  # (N,)
        candidate_logits = (hidden @ candidate_rows.t()).float()  # (N, K)
        target_log_q = target_counts.log().float()  # (N,)
        candidate_log_q = candidate_counts.log().float()  # (K,)
        target_logits = target_logits + biases[:num_positions].float() - target_log_q
        candidate_logits = candidate_logits + biases[num_positions:].float() - candidate_log_q
        hits = targets.unsqueeze(1) == candidates.unsqueeze(0)  # (N, K)
        candidate_logits = candidate_logits.masked_fill(hits, torch.finfo(torch.float32).min)
        logits = torch.cat([target_logits.unsqueeze(1), candidate_logits], dim=1)  # (N, 1+K)
        return torch.logsumexp(logits, dim=1) - target_logits

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
