"""CRF: forward algorithm and Viterbi against brute-force enumeration on tiny sizes."""

from __future__ import annotations

import itertools

import pytest
import torch

from elmo_core.tasks.crf import CRF

NUM_TAGS = 3
LENGTHS = [4, 1, 3]


def _setup(seed: int = 0) -> tuple[CRF, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    crf = CRF(NUM_TAGS)
    with torch.no_grad():
        for parameter in crf.parameters():
            parameter.normal_()
    emissions = torch.randn(len(LENGTHS), max(LENGTHS), NUM_TAGS)
    mask = torch.arange(max(LENGTHS)) < torch.tensor(LENGTHS).unsqueeze(1)
    return crf, emissions, mask


def _sequence_score(crf: CRF, emissions: torch.Tensor, tags: tuple[int, ...]) -> torch.Tensor:
    score = crf.start_transitions[tags[0]] + crf.end_transitions[tags[-1]]
    for step, tag in enumerate(tags):
        score = score + emissions[step, tag]
        if step:
            score = score + crf.transitions[tags[step - 1], tag]
    return score


def _all_scores(crf: CRF, emissions: torch.Tensor, length: int) -> dict[tuple[int, ...], float]:
    with torch.no_grad():
        return {
            tags: float(_sequence_score(crf, emissions, tags))
            for tags in itertools.product(range(NUM_TAGS), repeat=length)
        }


def test_log_likelihood_equals_brute_force_normalisation() -> None:
    crf, emissions, mask = _setup()
    tags = torch.randint(0, NUM_TAGS, mask.shape)
    got = crf.log_likelihood(emissions, tags, mask).detach()
    for row, length in enumerate(LENGTHS):
        all_scores = _all_scores(crf, emissions[row], length)
        scores = torch.tensor(list(all_scores.values()))
        gold = all_scores[tuple(tags[row, :length].tolist())]
        assert float(got[row]) == pytest.approx(float(gold - torch.logsumexp(scores, 0)), abs=1e-5)


def test_probabilities_of_all_sequences_sum_to_one() -> None:
    crf, emissions, _ = _setup(seed=1)
    length = 3
    total = 0.0
    for tags in itertools.product(range(NUM_TAGS), repeat=length):
        ll = crf.log_likelihood(
            emissions[:1, :length], torch.tensor([tags]), torch.ones(1, length, dtype=torch.bool)
        )
        total += float(ll.detach().exp())
    assert total == pytest.approx(1.0, abs=1e-5)


def test_viterbi_equals_brute_force_argmax() -> None:
    for seed in range(5):
        crf, emissions, mask = _setup(seed)
        path = crf.viterbi_decode(emissions, mask)
        for row, length in enumerate(LENGTHS):
            scores = _all_scores(crf, emissions[row], length)
            assert tuple(path[row, :length].tolist()) == max(scores, key=scores.__getitem__)
            assert path[row, length:].eq(0).all()


def test_padded_positions_do_not_change_the_likelihood() -> None:
    crf, emissions, mask = _setup()
    tags = torch.randint(0, NUM_TAGS, mask.shape)
    noisy = emissions.clone()
    noisy[~mask] = 100.0
    other_tags = torch.where(mask, tags, (tags + 1) % NUM_TAGS)
    assert torch.allclose(
        crf.log_likelihood(emissions, tags, mask), crf.log_likelihood(noisy, other_tags, mask)
    )
    assert torch.equal(crf.viterbi_decode(emissions, mask), crf.viterbi_decode(noisy, mask))


def test_gradients_reach_every_parameter() -> None:
    crf, emissions, mask = _setup()
    emissions.requires_grad_(True)
    crf.log_likelihood(emissions, torch.zeros_like(mask, dtype=torch.long), mask).sum().backward()
    assert emissions.grad is not None and crf.transitions.grad is not None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in crf.parameters())


def test_a_row_without_tokens_is_refused() -> None:
    crf, emissions, mask = _setup()
    mask[1] = False
    with pytest.raises(ValueError, match="at least one real token"):
        crf.viterbi_decode(emissions, mask)
