"""Per-split type counts summed by Arrow and NumPy: blocks, files, folds."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pyarrow as pa

from elmo_core.text import type_counts
from elmo_core.text.type_counts import COUNT_SCHEMA, TypeCounts, fold_counts, merge_counts


def as_dict(table: pa.Table) -> dict[str, tuple[int, int, int]]:
    rows = zip(*(table[name].to_pylist() for name in COUNT_SCHEMA.names), strict=True)
    return {token: (count, heldout, first) for token, count, heldout, first in rows}


def table(rows: dict[str, tuple[int, int, int]]) -> pa.Table:
    columns = zip(*rows.values(), strict=True)
    return pa.Table.from_arrays(
        [pa.array(list(rows)), *(pa.array(column, pa.int64()) for column in columns)],
        schema=COUNT_SCHEMA,
    )


def test_blocks_and_files_sum_per_split_keep_the_first_seen_and_zeros_add_nothing():
    counts = TypeCounts()
    counts.add(pa.array(["a", "b", "é"]), np.array([2, 0, 1]), np.array([5, 6, 7]), "train")
    tokens = pa.array(["b", "c", "a"]).slice(1)
    counts.add(tokens, np.array([4, 3]), np.array([8, 9]), "heldout")
    counts.add_table(table({"a": (10, 0, 0), "new": (0, 7, 1)}), first_seen_offset=100)
    assert as_dict(counts.table()) == {
        "a": (12, 3, 5), "é": (1, 0, 7), "c": (0, 4, 8), "new": (0, 7, 101),
    }  # fmt: skip
    assert as_dict(TypeCounts().table()) == {}


def test_random_blocks_sum_as_a_counter():
    rng = random.Random(0)
    words = [f"w{i}" + "x" * (i % 13) for i in range(300)]  # short and > 8-byte tokens
    expected = {"train": Counter(), "heldout": Counter()}
    first: dict[str, int] = {}
    counts = TypeCounts()
    for block_number in range(40):
        split = rng.choice(["train", "heldout"])
        block = Counter(rng.choice(words) for _ in range(rng.randint(0, 200)))
        keys = np.arange(len(block)) + 1000 * block_number
        counts.add(pa.array(list(block), pa.string()), np.array(list(block.values())), keys, split)
        expected[split].update(block)
        for token, key in zip(block, keys.tolist(), strict=True):
            first.setdefault(token, key)
    seen = set(expected["train"]) | set(expected["heldout"])
    assert as_dict(counts.table()) == {
        token: (expected["train"][token], expected["heldout"][token], first[token])
        for token in seen
    }


def test_fold_waits_until_new_rows_outnumber_the_total_then_sums(monkeypatch):
    monkeypatch.setattr(type_counts, "FOLD_ROWS", 3)
    total = table({"a": (1, 0, 3), "b": (2, 0, 0), "c": (3, 0, 1), "d": (4, 1, 2)})
    small = table({"a": (10, 1, 0), "e": (1, 0, 1)})
    assert fold_counts([total, small]) == [total, small]  # 2 new rows < 4 merged
    more = [table({"b": (5, 0, 9), "f": (1, 0, 2)}), table({"g": (7, 2, 4)})]
    folded = fold_counts([total, small, *more])
    assert len(folded) == 1
    assert as_dict(folded[0]) == {
        "a": (11, 1, 0), "b": (7, 0, 0), "c": (3, 0, 1), "d": (4, 1, 2), "e": (1, 0, 1),
        "f": (1, 0, 2), "g": (7, 2, 4),
    }  # fmt: skip
    assert as_dict(merge_counts([])) == {}
