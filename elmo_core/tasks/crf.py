"""A linear-chain conditional random field over per-token tag scores (Lafferty et al. 2001).

The tagging output layer of the paper's NER model (Peters et al. 2018, §5). The forward algorithm
and Viterbi loop over time only, every step batched over rows and tags.
Shapes: B rows, T tokens, K tags. Masks are right-padded and every row has a real token.
"""

from __future__ import annotations

import torch
from torch import nn


class CRF(nn.Module):
    """Transition, start and end scores for ``num_tags`` tags, learnt with the tagger.

    A sequence scores ``start[y_1] + Σ_t emission[t, y_t] + Σ_t transition[y_{t-1}, y_t] +
    end[y_n]``.
    """

    def __init__(self, num_tags: int) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))  # (K, K) [from, to]
        self.start_transitions = nn.Parameter(torch.zeros(num_tags))  # (K,)
        self.end_transitions = nn.Parameter(torch.zeros(num_tags))  # (K,)
        nn.init.uniform_(self.transitions, -0.1, 0.1)

    def log_likelihood(
        self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """``log p(tags | emissions)`` per row → (B,); ``emissions (B, T, K)``, ``tags (B, T)``."""
        _check_mask(mask)
        return self._gold_score(emissions, tags, mask) - self._log_partition(emissions, mask)

    def viterbi_decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The best tag sequence per row → ``(B, T)``, 0 at padded positions."""
        _check_mask(mask)
        batch_size, num_steps, _ = emissions.shape
        score = self.start_transitions + emissions[:, 0]  # (B, K)
        backpointers = []
        for step in range(1, num_steps):
            candidates = score.unsqueeze(2) + self.transitions  # (B, K_from, K_to)
            best, best_from = candidates.max(dim=1)  # (B, K)
            live = mask[:, step].unsqueeze(1)  # (B, 1)
            score = torch.where(live, best + emissions[:, step], score)  # (B, K)
            backpointers.append(best_from)
        lengths = mask.sum(dim=1)  # (B,)
        current = (score + self.end_transitions).argmax(dim=1)  # (B,) tag at each row's end
        path = torch.zeros(batch_size, num_steps, dtype=torch.long, device=emissions.device)
        for step in range(num_steps - 1, -1, -1):
            path[:, step] = current
            if step > 0:
                previous = backpointers[step - 1].gather(1, current.unsqueeze(1)).squeeze(1)
                current = torch.where(step <= lengths - 1, previous, current)  # (B,)
        return path * mask.long()  # (B, T)

    def _gold_score(
        self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        weights = mask.to(emissions.dtype)  # (B, T)
        emitted = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # (B, T)
        score = self.start_transitions[tags[:, 0]] + (emitted * weights).sum(dim=1)  # (B,)
        moved = self.transitions[tags[:, :-1], tags[:, 1:]]  # (B, T-1)
        score = score + (moved * weights[:, 1:]).sum(dim=1)  # (B,)
        last = tags.gather(1, (mask.sum(dim=1, keepdim=True) - 1)).squeeze(1)  # (B,)
        return score + self.end_transitions[last]

    def _log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The forward algorithm: ``log Σ_y exp score(y)`` per row → (B,)."""
        alpha = self.start_transitions + emissions[:, 0]  # (B, K)
        for step in range(1, emissions.shape[1]):
            scores = alpha.unsqueeze(2) + self.transitions  # (B, K_from, K_to)
            moved = torch.logsumexp(scores, dim=1) + emissions[:, step]  # (B, K)
            alpha = torch.where(mask[:, step].unsqueeze(1), moved, alpha)  # (B, K)
        return torch.logsumexp(alpha + self.end_transitions, dim=1)


def _check_mask(mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"the CRF mask must be bool, not {mask.dtype}")
    if not bool(mask[:, 0].all()):
        raise ValueError("every row needs at least one real token at position 0")
