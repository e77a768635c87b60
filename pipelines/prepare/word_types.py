"""The word-type table of a prepared dataset: its order, built after pass 1, and the file itself.

The vocabulary comes first (type id = vocabulary id); pass 2's workers memory-map the order as an
Arrow IPC file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.data.shards import (
    TYPE_ORDER_SCHEMA,
    WORD_TYPES_SCHEMA,
    char_id_column,
    write_parquet,
)
from elmo_core.location import atomic_write, sha256_file
from elmo_core.text.char_ids import MAX_TOKEN_BYTES
from elmo_core.text.vocab import UNK_ID, Vocabulary


@dataclass(frozen=True)
class WordTypeSummary:
    """Per-split totals the manifest needs that come from the type counts."""

    num_types: int
    num_oov_tokens: dict[str, int]
    truncated_tokens: dict[str, int]


def build_type_order(seen: pa.Table, vocab: Vocabulary) -> tuple[pa.Table, WordTypeSummary]:
    """The word-type table less its char ids (:data:`TYPE_ORDER_SCHEMA`): vocabulary entries
    first (type id = vocab id), then OOV types. :func:`write_word_types` adds the char ids.

    ``seen``: every type counted (:data:`~elmo_core.text.type_counts.COUNT_SCHEMA`). OOV types
    are ordered by descending total count, ties by where they were first seen (input file
    order, then position): deterministic, and a numeric sort where sorting the strings cost a
    quarter of a second per 500k types.
    """
    vocab_tokens = vocab.as_arrow()
    vocab_id = pc.index_in(seen["token"], value_set=vocab_tokens)  # (S,) null: OOV
    in_vocab = pc.is_valid(vocab_id).to_numpy(zero_copy_only=False)
    row_of_vocab = np.full(len(vocab), len(seen), dtype=np.int64)  # unseen → the 0 appended
    row_of_vocab[pc.drop_null(vocab_id).to_numpy()] = np.flatnonzero(in_vocab)
    counts = {name: seen[name].to_numpy() for name in ("count", "heldout_count", "first_seen")}
    oov_rows = np.flatnonzero(~in_vocab)
    total = counts["count"][oov_rows] + counts["heldout_count"][oov_rows]
    oov_rows = oov_rows[np.lexsort((counts["first_seen"][oov_rows], -total))]
    tokens = pa.concat_arrays([vocab_tokens, _array(seen["token"]).take(pa.array(oov_rows))])
    num_types = len(tokens)
    type_ids = np.arange(num_types, dtype=np.int32)
    rows = np.concatenate([row_of_vocab, oov_rows])  # the row of `seen` of each type
    type_counts = {name: np.append(counts[name], 0)[rows] for name in ("count", "heldout_count")}
    table = pa.Table.from_arrays(
        [
            pa.array(type_ids),
            tokens,
            pa.array(type_counts["count"]),
            pa.array(type_counts["heldout_count"]),
            pa.array(np.where(type_ids < len(vocab), type_ids, np.int32(UNK_ID))),
        ],
        schema=TYPE_ORDER_SCHEMA,
    )
    long = pc.greater(pc.binary_length(seen["token"]), MAX_TOKEN_BYTES)
    summary = WordTypeSummary(
        num_types=num_types,
        num_oov_tokens={
            split: int(type_counts[name][len(vocab) :].sum())
            for split, name in (("train", "count"), ("heldout", "heldout_count"))
        },
        truncated_tokens={
            "train": _sum(seen["count"].filter(long)),
            "heldout": _sum(seen["heldout_count"].filter(long)),
        },
    )
    return table, summary


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _sum(column: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(column).as_py() or 0)


def write_type_order(table: pa.Table, path: Path) -> str:
    """The type order as an Arrow IPC file (pass 2 maps it instead of decoding Parquet); sha256."""

    def write(temporary: Path) -> str:
        with pa.ipc.new_file(str(temporary), TYPE_ORDER_SCHEMA) as writer:
            writer.write_table(table)
        return sha256_file(temporary)

    return atomic_write(path, write)


def read_type_order(path: Path) -> pa.Table:
    """:func:`write_type_order`'s file, memory-mapped."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def read_type_tokens(path: Path) -> pa.Array:
    """The ``token`` column of a type order (``.arrow``) or of ``word_types.parquet``."""
    if path.suffix == ".arrow":
        table = read_type_order(path)
    else:  # ParquetFile, not read_table: that imports pyarrow.dataset (20 ms) for one file.
        table = pq.ParquetFile(path).read(columns=["token"])
    return table["token"].combine_chunks()


@dataclass(frozen=True)
class WordTypesTask:
    """Pass 2's one task that is not a file: the type order plus char ids → word_types.parquet.

    It runs in the pool beside the files' tasks, so the char ids and the Parquet writing (about
    a fifth of a second per 400k types) are not serial work between the passes.
    """

    type_order: Path  # write_type_order's file
    out: Path  # the local word_types.parquet


def write_word_types(task: WordTypesTask) -> str:
    """Write ``word_types.parquet`` (atomically); its sha256."""
    table = read_type_order(task.type_order)
    table = table.append_column(
        WORD_TYPES_SCHEMA.field("char_ids"), char_id_column(table["token"].combine_chunks())
    )
    return write_parquet(table, task.out, 1 << 16)
