"""The parsing type: attachment scores with punctuation counted or not, ids to ``head:relation``,
its output rows and error tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.types.parsing import Parsing

LABELS = ["nsubj", "punct", "root"]


def _task(punctuation: str = "counted") -> TaskConfig:
    return TaskConfig(
        name="p",
        type="parsing",
        format="conllu",
        train=Path("x"),
        reader={"punctuation": punctuation},  # type: ignore[arg-type]
    )


def _ids(arcs: list[tuple[int, str]]) -> np.ndarray:
    return np.array([head * len(LABELS) + LABELS.index(r) for head, r in arcs], dtype=np.int64)


def test_uas_and_las_count_every_word_unless_punctuation_is_excluded() -> None:
    gold = _ids([(2, "nsubj"), (0, "root"), (2, "punct")])
    predicted = _ids([(2, "punct"), (0, "root"), (1, "punct")])  # a wrong label, a wrong head
    offsets = np.array([0, 3])
    every = Parsing().scores(_task(), LABELS, gold, predicted, offsets)
    assert every == {"uas": pytest.approx(2 / 3), "las": pytest.approx(1 / 3)}
    words = Parsing().scores(_task("excluded"), LABELS, gold, predicted, offsets)
    assert words == {"uas": 1.0, "las": 0.5}
    assert Parsing().main_metric(_task()) == "las"


def test_ids_become_head_relation_strings_and_output_rows() -> None:
    kind = Parsing()
    words = kind.token_labels(_ids([(2, "nsubj"), (0, "root")]).tolist(), LABELS)
    assert words == ["2:nsubj", "0:root"]
    rows = kind.output_rows([["Dogs", "bark"], []], [words, kind.no_prediction()])
    assert rows == {
        "tokens": [["Dogs", "bark"], []],
        "heads": [[2, 0], []],
        "relations": [["nsubj", "root"], []],
    }


def test_error_tables_name_the_relations_confused_and_attachment_by_distance() -> None:
    gold = [["2:nsubj", "0:root", "2:punct"], ["0:root", "1:nsubj"]]
    predicted = [["2:punct", "0:root", "1:punct"], ["0:root", "1:nsubj"]]
    tables = Parsing().error_tables(_task(), LABELS, gold, predicted)
    assert tables.per_type is not None and tables.per_type["type"][-1] == "(all)"
    confused = tables.more["relations_confused.json"]
    assert confused == {"gold": ["nsubj"], "predicted": ["punct"], "words": [1]}
    by_distance = tables.more["attachment_by_distance.json"]
    assert by_distance["distance"] == ["root", "1"]
    assert by_distance["words"] == [2, 3] and by_distance["uas"] == [1.0, pytest.approx(2 / 3)]
