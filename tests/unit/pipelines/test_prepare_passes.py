"""Count merging and the word-type table of prepare's passes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from elmo_core.text.vocab import SPECIALS, Vocabulary
from pipelines import prepare_passes
from pipelines.prepare_passes import COUNT_SCHEMA, build_word_types, fold_counts, merge_counts


def counts(pairs: dict[str, int]) -> pa.Table:
    return pa.table(
        {"token": list(pairs), "count": pa.array(list(pairs.values()), pa.int64())},
        schema=COUNT_SCHEMA,
    )


def as_dict(table: pa.Table) -> dict[str, int]:
    return dict(zip(table["token"].to_pylist(), table["count"].to_pylist(), strict=True))


def test_fold_waits_until_new_rows_outnumber_the_total_then_sums(monkeypatch):
    monkeypatch.setattr(prepare_passes, "FOLD_ROWS", 3)
    total = counts({"a": 1, "b": 2, "c": 3, "d": 4})
    small = counts({"a": 10, "e": 1})
    assert fold_counts([total, small]) == [total, small]  # 2 new rows < 4 merged
    folded = fold_counts([total, small, counts({"b": 5, "f": 1}), counts({"g": 7})])
    assert len(folded) == 1
    assert as_dict(folded[0]) == {"a": 11, "b": 7, "c": 3, "d": 4, "e": 1, "f": 1, "g": 7}
    assert as_dict(merge_counts([])) == {}


def test_word_types_join_training_and_heldout_counts():
    train = counts({"the": 5, "cat": 3, "rare": 1, "dog": 1})
    heldout = counts({"cat": 2, "zebra": 4, "dog": 1})
    vocab = Vocabulary(
        tokens=[*SPECIALS, "the", "cat", "unseen"], counts=np.array([0, 0, 0, 5, 3, 0])
    )
    table, summary = build_word_types(train, heldout, vocab)
    rows = table.select(["token", "count", "heldout_count", "vocab_id"]).to_pylist()
    assert [tuple(row.values()) for row in rows] == [
        ("<S>", 0, 0, 0),
        ("</S>", 0, 0, 1),
        ("<UNK>", 0, 0, 2),
        ("the", 5, 0, 3),
        ("cat", 3, 2, 4),
        ("unseen", 0, 0, 5),
        ("zebra", 0, 4, 2),  # OOV by total count, then by bytes
        ("dog", 1, 1, 2),
        ("rare", 1, 0, 2),
    ]
    assert table["type_id"].to_pylist() == list(range(9))
    assert summary.num_types == 9
    assert summary.num_oov_tokens == {"train": 2, "heldout": 5}
