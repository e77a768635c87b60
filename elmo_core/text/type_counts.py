"""Occurrences of each word type per split, summed as blocks and files arrive.

Each type keeps where it was first seen, which orders the types the vocabulary leaves out without
sorting their strings.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPLIT_COLUMNS = {"train": "count", "heldout": "heldout_count"}
COUNT_SCHEMA = pa.schema(
    [
        ("token", pa.string()),
        ("count", pa.int64()),
        ("heldout_count", pa.int64()),
        ("first_seen", pa.int64()),
    ]
)
FOLD_ROWS = 1 << 19  # rows held before they are merged, ~10 MB


class TypeCounts:
    """Per-split counts of distinct tokens; :meth:`table` is the total so far."""

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []  # the total merged so far first, then new rows

    def add(self, tokens: pa.Array, counts: np.ndarray, first_seen: np.ndarray, split: str) -> None:
        """Add ``counts[i]`` occurrences of ``tokens[i]`` (distinct) to ``split``, first seen at
        ``first_seen[i]``; tokens counted 0 are not added."""
        column = list(SPLIT_COLUMNS).index(split)
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        first_seen = np.ascontiguousarray(first_seen, dtype=np.int64)
        seen = np.flatnonzero(counts)
        columns = [np.zeros(len(seen), np.int64), np.zeros(len(seen), np.int64)]
        columns[column] = counts[seen]
        table = pa.Table.from_arrays(
            [tokens.take(seen), *columns, first_seen[seen]], schema=COUNT_SCHEMA
        )
        self._tables.append(table)
        self._tables = fold_counts(self._tables)

    def add_table(self, table: pa.Table, first_seen_offset: int = 0) -> None:
        """Add another total (a :data:`COUNT_SCHEMA` table, as :meth:`table` returns), its
        ``first_seen`` keys shifted by ``first_seen_offset``."""
        first_seen = pc.add(table["first_seen"], pa.scalar(first_seen_offset, pa.int64()))
        self._tables.append(table.set_column(3, COUNT_SCHEMA.field("first_seen"), first_seen))
        self._tables = fold_counts(self._tables)

    def table(self) -> pa.Table:
        """One row per token counted in either split: both splits' counts, where first seen."""
        self._tables = [merge_counts(self._tables)]
        return self._tables[0]


def fold_counts(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` (the merged total first, then new ones) folded into one when that pays.

    New rows are merged once they outnumber ``FOLD_ROWS`` and the total merged so far: memory
    stays within a small multiple of the number of types, whatever the corpus length, and each
    fold's re-hashing of the total is paid for by as many new rows.
    """
    pending = sum(len(table) for table in tables[1:])
    if len(tables) < 2 or pending < max(FOLD_ROWS, len(tables[0])):
        return tables
    return [merge_counts(tables)]


def merge_counts(tables: list[pa.Table]) -> pa.Table:
    """Sum :data:`COUNT_SCHEMA` tables by token (the earliest ``first_seen`` kept).

    Arrow's ``dictionary_encode`` hashes the tokens once (rows of a token share an index, in
    first-occurrence order); NumPy's unbuffered ``add.at`` and ``minimum.at`` then sum the counts
    and keep the earliest key per index, several times faster than a ``group_by`` plan.
    """
    if not tables:
        return COUNT_SCHEMA.empty_table()
    if len(tables) == 1:
        return tables[0]
    table = pa.concat_tables(tables)
    tokens = pc.dictionary_encode(_array(table["token"]))
    ids, num = tokens.indices.to_numpy(), len(tokens.dictionary)
    columns = []
    for name in SPLIT_COLUMNS.values():
        total = np.zeros(num, dtype=np.int64)
        np.add.at(total, ids, _array(table[name]).to_numpy())
        columns.append(total)
    first_seen = np.full(num, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_seen, ids, _array(table["first_seen"]).to_numpy())
    return pa.Table.from_arrays([tokens.dictionary, *columns, first_seen], schema=COUNT_SCHEMA)


def split_totals(table: pa.Table) -> dict[str, int]:
    """Occurrences per split of a :data:`COUNT_SCHEMA` table."""
    return {split: int(pc.sum(table[name]).as_py() or 0) for split, name in SPLIT_COLUMNS.items()}


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
