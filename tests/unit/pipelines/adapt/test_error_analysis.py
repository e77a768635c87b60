"""The sample predictions an adapt run logs: a sample of both kinds, the errors first."""

from __future__ import annotations

import pytest

from elmo_core.tasks.dataset import ClassificationExample
from elmo_core.tasks.types import TASK_TYPES
from pipelines.adapt.error_analysis import SplitPredictions, sample_table


def _found(outcomes: str) -> SplitPredictions:
    """One example per character: ``r`` predicted right, ``w`` wrong."""
    examples = [ClassificationExample([f"sentence{i}"], "POS") for i in range(len(outcomes))]
    predicted = ["POS" if outcome == "r" else "NEG" for outcome in outcomes]
    return SplitPredictions("test", examples, ["POS"] * len(outcomes), predicted)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ("w" * 25 + "r" * 5, [False] * 5 + [True] * 5),  # mostly errors: half and half
        ("r" * 25 + "w" * 2, [False] * 2 + [True] * 8),  # few errors: all of them, then right
        ("w" * 12, [False] * 10),  # nothing right: errors only
        ("rwr", [False, True, True]),  # a small split: every example
    ],
)
def test_the_sample_holds_errors_and_right_predictions_errors_first(
    outcomes: str, expected: list[bool]
) -> None:
    table = sample_table(_found(outcomes), TASK_TYPES["classification"])
    assert table["correct"] == expected
    picked = [int(sentence.removeprefix("sentence")) for sentence in table["sentence"]]
    errors = [i for i in picked if outcomes[i] == "w"]
    assert errors == sorted(errors) and picked[len(errors) :] == sorted(picked[len(errors) :])
