"""The word-type table: the type order, then word_types.parquet from it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from elmo_core.data.shards import TYPE_ORDER_SCHEMA, char_ids_matrix
from elmo_core.location import sha256_file
from elmo_core.text.char_ids import token_to_ids
from elmo_core.text.type_counts import COUNT_SCHEMA
from elmo_core.text.vocab import SPECIALS, Vocabulary
from pipelines.prepare.word_types import (
    WordTypesTask,
    build_type_order,
    read_type_tokens,
    write_type_order,
    write_word_types,
)


def seen_types() -> pa.Table:
    return pa.table(
        {
            "token": ["the", "cat", "rare", "dog", "zebra", "ant"],
            "count": pa.array([5, 3, 1, 1, 0, 2], pa.int64()),
            "heldout_count": pa.array([0, 2, 0, 1, 4, 0], pa.int64()),
            "first_seen": pa.array([0, 1, 2, 5, 4, 9], pa.int64()),
        },
        schema=COUNT_SCHEMA,
    )


VOCAB = Vocabulary(tokens=[*SPECIALS, "the", "cat", "unseen"], counts=np.array([0, 0, 0, 5, 3, 0]))


def test_type_order_joins_training_and_heldout_counts():
    table, summary = build_type_order(seen_types(), VOCAB)
    assert table.schema == TYPE_ORDER_SCHEMA
    rows = table.select(["token", "count", "heldout_count", "vocab_id"]).to_pylist()
    assert [tuple(row.values()) for row in rows] == [
        ("<S>", 0, 0, 0),
        ("</S>", 0, 0, 1),
        ("<UNK>", 0, 0, 2),
        ("the", 5, 0, 3),
        ("cat", 3, 2, 4),
        ("unseen", 0, 0, 5),
        ("zebra", 0, 4, 2),  # OOV by total count, then where first seen
        ("dog", 1, 1, 2),
        ("ant", 2, 0, 2),
        ("rare", 1, 0, 2),
    ]
    assert table["type_id"].to_pylist() == list(range(10))
    assert summary.num_types == 10
    assert summary.num_oov_tokens == {"train": 4, "heldout": 5}


def test_word_types_add_the_char_ids_to_the_type_order_and_both_give_the_same_tokens(tmp_path):
    table, _ = build_type_order(seen_types(), VOCAB)
    order = tmp_path / "work" / "type_order.arrow"
    digest = write_type_order(table, order)
    assert digest == sha256_file(order)
    out = tmp_path / "word_types.parquet"
    assert write_word_types(WordTypesTask(order, out)) == sha256_file(out)
    written = pq.read_table(out)
    assert written.drop_columns(["char_ids"]).equals(table)
    tokens = table["token"].to_pylist()
    expected = np.stack([token_to_ids(token) for token in tokens])
    np.testing.assert_array_equal(char_ids_matrix(written["char_ids"]), expected)
    assert read_type_tokens(order).to_pylist() == read_type_tokens(out).to_pylist() == tokens
    assert [p.name for p in tmp_path.rglob("*")] == [
        "work",
        "word_types.parquet",
        "type_order.arrow",
    ]
