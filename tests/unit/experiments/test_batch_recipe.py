import json
import math
import sys

import pytest


@pytest.fixture
def batch_recipe():
    from experiments import batch_recipe

    return batch_recipe


def test_the_mean_before_a_step_covers_the_ten_steps_up_to_it(batch_recipe):
    losses = [float(step) for step in range(1, 31)]
    assert batch_recipe.mean_before(losses, 30) == sum(range(21, 31)) / 10
    assert batch_recipe.mean_before(losses, 4) == 2.5  # fewer than ten steps so far
    assert batch_recipe.mean_before(losses, 0) == 1.0  # at least the first


def test_a_short_run_compares_three_recipes_and_ends_with_json(batch_recipe, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["batch_recipe.py"])
    args = ["--preset", "tiny", "--rows", "256", "--steps", "4", "--corpus", "python-docs"]
    assert batch_recipe.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    runs = [summary[key] for key in ("rows128_lr0.200", "rows256_lr0.200", "rows256_lr0.283")]
    for run in runs:
        assert math.isfinite(run["loss_at_steps"]) and run["heldout_perplexity"] > 1
    assert runs[0]["loss_at_base_positions"] == runs[0]["loss_at_steps"]


def test_a_batch_no_larger_than_bilm_tfs_is_refused(batch_recipe):
    with pytest.raises(SystemExit):
        batch_recipe.main(["--rows", "128"])
