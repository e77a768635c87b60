"""Scores over seeds and the verdict on a difference of means."""

from __future__ import annotations

import math

import pytest

from elmo_core.tasks.seeds import Scores, difference


def test_scores_give_the_mean_and_the_sample_sd() -> None:
    assert Scores((0.5,)).sd == 0.0
    scores = Scores((0.5, 0.7, 0.9))
    assert scores.mean == pytest.approx(0.7) and scores.sd == pytest.approx(0.2)
    assert str(scores) == "0.7000 ± 0.2000" and str(Scores((0.5,))) == "0.5000"


def test_a_gain_larger_than_the_sd_of_the_difference_is_beyond_it() -> None:
    elmo, baseline = Scores((0.80, 0.82, 0.84)), Scores((0.70, 0.72, 0.74))
    sd = math.hypot(0.02, 0.02)
    assert (
        difference(elmo, baseline)
        == f"gain +0.1000, beyond the gain's standard deviation ({sd:.4f})"
    )


def test_a_gain_inside_the_sd_says_so_whatever_its_sign() -> None:
    elmo, baseline = Scores((0.70, 0.80, 0.90)), Scores((0.72, 0.74, 0.76))
    assert difference(elmo, baseline).startswith(
        "gain +0.0600, within the gain's standard deviation"
    )
    assert difference(baseline, elmo).startswith(
        "gain -0.0600, within the gain's standard deviation"
    )


def test_one_seed_claims_no_sd() -> None:
    assert (
        difference(Scores((0.9,)), Scores((0.8, 0.7)))
        == "gain +0.1500 (one seed: no standard deviation)"
    )


def test_seeds_that_all_score_the_same_give_no_sd_to_judge_by() -> None:
    same = difference(Scores((1.0, 1.0, 1.0)), Scores((0.99, 0.99, 0.99)))
    assert same == "gain +0.0100, every seed scoring the same"
