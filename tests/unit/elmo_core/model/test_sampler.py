"""The log-uniform sampler against its formula and Monte Carlo, and the rows a window touches."""

import math

import numpy as np
import pytest
import torch

from elmo_core.model.sampler import LogUniformSampler, touched_rows


def test_sampler_probabilities_are_the_log_uniform_formula_and_sum_to_one():
    sampler = LogUniformSampler(1000)
    p = sampler.probability(torch.arange(1000))
    assert p[0].item() == pytest.approx(math.log(2) / math.log(1001))
    assert p[9].item() == pytest.approx((math.log(11) - math.log(10)) / math.log(1001))
    assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert (p[1:] < p[:-1]).all()


def test_sampler_draw_frequencies_follow_the_distribution():
    sampler = LogUniformSampler(20)
    draws = sampler.draw(200_000, torch.Generator().manual_seed(0))
    assert draws.min() >= 0 and draws.max() <= 19
    frequency = torch.bincount(draws, minlength=20).double() / draws.numel()
    torch.testing.assert_close(frequency, sampler.probability(torch.arange(20)), atol=4e-3, rtol=0)


def test_unique_candidates_are_distinct_and_tries_count_every_draw():
    sampler = LogUniformSampler(100)
    candidates, num_tries = sampler.sample_unique(30, torch.Generator().manual_seed(1))
    assert candidates.shape == (30,) and candidates.dtype == torch.long
    assert candidates.unique().numel() == 30
    assert num_tries >= 30
    # The same generator state replays the draws: the K-th new id appears at draw num_tries.
    draws = sampler.draw(num_tries, torch.Generator().manual_seed(1))
    assert draws.unique().numel() == 30
    assert draws[-1] == candidates[-1] and draws[:-1].eq(candidates[-1]).sum() == 0


def test_unique_sampling_needing_several_batches_still_counts_exactly():
    sampler = LogUniformSampler(40)
    candidates, num_tries = sampler.sample_unique(39, torch.Generator().manual_seed(2))
    assert sorted(candidates.tolist()) != list(range(40))  # one class is left out
    assert candidates.unique().numel() == 39
    draws = sampler.draw(num_tries, torch.Generator().manual_seed(2))
    assert draws.unique().numel() == 39 and draws[:-1].unique().numel() == 38


def test_expected_counts_match_monte_carlo_frequencies_of_unique_sampling():
    num_classes, num_samples, repeats = 30, 8, 4000
    sampler = LogUniformSampler(num_classes)
    generator = torch.Generator().manual_seed(3)
    hits = torch.zeros(num_classes, dtype=torch.float64)
    predicted = torch.zeros(num_classes, dtype=torch.float64)
    for _ in range(repeats):
        candidates, num_tries = sampler.sample_unique(num_samples, generator)
        hits[candidates] += 1
        predicted += sampler.expected_count(torch.arange(num_classes), num_tries)
    # Conditioned on num_tries the formula is an approximation; on average it must hold.
    torch.testing.assert_close(hits / repeats, predicted / repeats, atol=0.03, rtol=0.05)


def test_expected_count_is_stable_for_rare_classes():
    sampler = LogUniformSampler(793_471)
    ids = torch.tensor([0, 793_470])
    counts = sampler.expected_count(ids, 10_000)
    p = sampler.probability(ids)
    assert 0 < counts[1].item() < 10_000 * p[1].item()
    assert counts[1].item() == pytest.approx(-math.expm1(10_000 * math.log1p(-p[1].item())))
    assert counts[0].item() == pytest.approx(1 - (1 - p[0].item()) ** 10_000, rel=1e-9)


def test_touched_rows_are_sorted_distinct_and_read_row_0_for_unscored_targets():
    targets = np.array([[9, -1, 4], [4, 9, 3]])
    assert touched_rows(targets, np.array([3, 12]), np.array([12, 1])).tolist() == [
        0,
        1,
        3,
        4,
        9,
        12,
    ]
