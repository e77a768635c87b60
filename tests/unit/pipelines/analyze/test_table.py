"""The analysis table's headline: the sample-efficiency point and the winning layers."""

from __future__ import annotations

import pytest

from elmo_core.analysis.task_runs import INPUT, INPUT_OUTPUT, MIX, TaskAnalysis
from elmo_core.tasks.seeds import Scores
from pipelines.analyze.table import Cell, Row, format_rows, headline, headline_metrics, task_rows


def test_the_headline_names_the_fraction_of_the_largest_gain_and_the_best_layers() -> None:
    analysis = TaskAnalysis("docstrings", "test_accuracy")
    analysis.efficiency = {
        0.25: {"elmo": Scores((0.52, 0.54)), "baseline": Scores((0.46, 0.47))},
        1.0: {"elmo": Scores((0.64, 0.65)), "baseline": Scores((0.62, 0.61))},
    }
    analysis.layers = {MIX: Scores((0.9, 0.9)), "0": Scores((0.6, 0.6)), "1": Scores((0.7, 0.8))}
    senses = Row(
        "word sense, nearest centroid accuracy",
        {"layer 0": Cell(0.48), "layer 1": Cell(0.72), "MFS": Cell(0.48)},
    )

    first, second, note = headline([analysis], [senses])

    assert first.startswith(
        "docstrings: with 25% of its training data, test_accuracy 0.5300 ± 0.0141 with ELMo, "
        "0.4650 ± 0.0071 without (gain +0.0650, beyond the gain's standard deviation"
    )
    assert first.endswith("each layer alone: best layer 1 (0.7500 ± 0.0707)")  # mix: no layer
    assert second == "word sense, nearest centroid accuracy: best layer 1 (0.720; MFS 0.480)"
    assert note == "(± is the sample standard deviation over the 2 seeds)"
    assert headline_metrics([analysis], [senses]) == pytest.approx(
        {
            "docstrings/gain_in_test_accuracy_at_best_fraction": 0.065,  # at 25%
            "docstrings/test_accuracy_of_best_single_layer": 0.75,  # layer 1; the mix is no layer
            "word_sense_nearest_centroid_accuracy_of_best_layer": 0.72,
        }
    )


def test_layers_that_tie_are_named_together() -> None:
    probe = Row(
        "ner linear probe accuracy",
        {"layer 0": Cell(0.9), "layer 1": Cell(0.8), "layer 2": Cell(0.9), "majority": Cell(0.6)},
    )
    (line,) = headline([], [probe])
    assert line == "ner linear probe accuracy: best layer 0 and layer 2 (0.900; majority 0.600)"


def test_a_probe_every_layer_of_which_scores_perfectly_is_saturated_not_won() -> None:
    probe = Row(
        "ner linear probe accuracy",
        {"layer 0": Cell(1.0), "layer 1": Cell(1.0), "majority": Cell(0.6)},
    )
    analysis = TaskAnalysis("ner", "test_f1")
    analysis.efficiency = {1.0: {"elmo": Scores((1.0, 1.0)), "baseline": Scores((0.9, 0.9))}}
    analysis.layers = {MIX: Scores((1.0, 1.0)), "0": Scores((1.0, 1.0)), "1": Scores((1.0, 1.0))}

    task, line, _ = headline([analysis], [probe])

    assert line == (
        "ner linear probe accuracy: saturated: every layer scores 1.000 on every seed "
        "(majority 0.600)"
    )
    assert task.endswith(
        "each layer alone: saturated: every layer scores 1.0000 ± 0.0000 on every seed"
    )


def test_a_probe_near_its_baseline_names_no_winner_and_shows_its_training_score() -> None:
    probe = Row(
        "ner linear probe accuracy",
        {"layer 0": Cell(0.84), "layer 1": Cell(0.856), "majority": Cell(0.825)},
        {"layer 0": Cell(0.85), "layer 1": Cell(0.87)},
    )
    (line,) = headline([], [probe])

    assert line == (
        "ner linear probe accuracy: no layer clears its baseline by 5 points, so none wins "
        "(best 0.856 (train 0.870); majority 0.825): the probe barely learns"
    )
    assert "layer 1 0.856 (train 0.870)" in format_rows([probe])


def test_a_task_whose_layers_alone_did_not_train_says_why_and_claims_no_best_layer() -> None:
    analysis = TaskAnalysis("subj", "test_accuracy")
    analysis.efficiency = {1.0: {"elmo": Scores((0.90, 0.92)), "baseline": Scores((0.91, 0.90))}}
    analysis.layers = {MIX: Scores((0.90, 0.92))}
    analysis.layers_not_run = "the mix on all of train: gain +0.0050, within (0.0158)"
    analysis.placement = {INPUT: Scores((0.90, 0.92)), INPUT_OUTPUT: Scores((0.91, 0.91))}
    analysis.mix_weights = [0.2, 0.3, 0.5]

    line, _ = headline([analysis], [])

    assert line.endswith(
        "each layer alone: not run (the mix on all of train: gain +0.0050, within (0.0158))"
    )
    assert list(headline_metrics([analysis], [])) == ["subj/gain_in_test_accuracy_at_best_fraction"]
    per_layer = next(row for row in task_rows(analysis) if "per layer" in row.analysis)
    assert list(per_layer.cells) == ["mix"]


def test_layers_alone_within_the_seeds_spread_of_the_best_are_no_winner() -> None:
    analysis = TaskAnalysis("subj", "test_accuracy")
    analysis.efficiency = {1.0: {"elmo": Scores((0.86, 0.88)), "baseline": Scores((0.84, 0.85))}}
    analysis.layers = {
        MIX: Scores((0.86, 0.88)),
        "0": Scores((0.855, 0.863)),  # 0.859: within the spread of layer 2's 0.860
        "1": Scores((0.80, 0.81)),  # far below
        "2": Scores((0.850, 0.870)),
    }
    line, _ = headline([analysis], [])
    assert line.endswith(
        "each layer alone: none beyond the seeds' spread: layer 2 0.8600 ± 0.0141, "
        "within it layer 0 0.8590 ± 0.0057"
    )
