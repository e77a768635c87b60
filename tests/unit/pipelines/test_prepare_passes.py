"""The word-type table of prepare's passes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from elmo_core.text.type_counts import COUNT_SCHEMA
from elmo_core.text.vocab import SPECIALS, Vocabulary
from pipelines.prepare_passes import build_word_types


def test_word_types_join_training_and_heldout_counts():
    seen = pa.table(
        {
            "token": ["the", "cat", "rare", "dog", "zebra", "ant"],
            "count": pa.array([5, 3, 1, 1, 0, 2], pa.int64()),
            "heldout_count": pa.array([0, 2, 0, 1, 4, 0], pa.int64()),
            "first_seen": pa.array([0, 1, 2, 5, 4, 9], pa.int64()),
        },
        schema=COUNT_SCHEMA,
    )
    vocab = Vocabulary(
        tokens=[*SPECIALS, "the", "cat", "unseen"], counts=np.array([0, 0, 0, 5, 3, 0])
    )
    table, summary = build_word_types(seen, vocab)
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
