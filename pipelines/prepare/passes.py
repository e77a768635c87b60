"""The work of the prepare stage: picklable tasks run in worker processes (a file or shard each).

Pass 1, :func:`count_file`: tokenize one input file block by block, dictionary-encode each block
(one hash of every token), count its word types per split from the dictionary indices, and spill
the encoded block (:class:`EncodedChunk`, an Arrow IPC stream per file) for pass 2. The parent
sums the files' counts (:class:`~elmo_core.text.type_counts.TypeCounts`), builds the vocabulary
and the order of the word types (:func:`build_type_order`).

Pass 2, :func:`encode_file`: read the file's spill (or, when a resumed run has none, tokenize
the file again) and map each block's dictionary to type ids, a lookup of its distinct tokens
only; heldout rows go, in source order, to the file's heldout parts; training rows are scattered
to per-shard spill files and shuffled by :mod:`pipelines.prepare.shuffle`. Neither pass holds
more than a block of text, one shard, and the type table in memory. Beside the files,
:func:`write_word_types` adds the char ids to the type order and writes ``word_types.parquet``.

All outputs are written under a temporary name and renamed; a spill is renamed into place only
when complete, so a crash never leaves a file that looks finished.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo
from elmo_core.data.shards import (
    HELDOUT_SCHEMA,
    TYPE_ORDER_SCHEMA,
    WORD_TYPES_SCHEMA,
    FileStats,
    SentenceChunk,
    TypeIndex,
    char_id_column,
    flat_lists,
    heldout_mask,
    read_sentences,
    sentence_table,
    train_shard_of,
    write_parquet,
)
from elmo_core.files import atomic_write, sha256_file
from elmo_core.text.char_ids import MAX_TOKEN_BYTES
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.type_counts import TypeCounts
from elmo_core.text.vocab import BOS_ID, EOS_ID, UNK_ID, Vocabulary
from pipelines.prepare.shuffle import ShardSpill, write_shard

TOKENS_SCHEMA = pa.schema(
    [("tokens", pa.list_(pa.dictionary(pa.int32(), pa.string()))), ("line", pa.int64())]
)


@dataclass(frozen=True)
class InputFile:
    """One input file: its position in the corpus (hash salt), local path, name and role."""

    index: int
    path: Path
    name: str  # relative to the corpus root: recorded in manifests and heldout rows
    role: Literal["train", "heldout"]


@dataclass(frozen=True)
class EncodedChunk:
    """A block of sentences with its tokens dictionary-encoded: what pass 1 spills for pass 2."""

    offsets: np.ndarray  # (n+1,) int32 sentence bounds in ``ids``
    ids: np.ndarray  # (N,) int32 each token's entry in ``dictionary``
    dictionary: pa.StringArray  # (D,) the block's distinct tokens
    lines: np.ndarray  # (n,) int64 1-based line of each sentence
    index: np.ndarray  # (n,) int64 sentence index within the file

    @staticmethod
    def encode(chunk: SentenceChunk) -> EncodedChunk:
        """The chunk's tokens dictionary-encoded, unless the tokenizer already did it."""
        values, offsets = flat_lists(chunk.sentences)
        encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        ids = encoded.indices.to_numpy(zero_copy_only=False)
        return EncodedChunk(
            offsets.astype(np.int32), ids, encoded.dictionary, chunk.lines, chunk.index
        )

    def to_batch(self) -> pa.RecordBatch:
        tokens = pa.DictionaryArray.from_arrays(pa.array(self.ids), self.dictionary)
        sentences = pa.ListArray.from_arrays(pa.array(self.offsets), tokens)
        return pa.record_batch([sentences, pa.array(self.lines)], schema=TOKENS_SCHEMA)

    @staticmethod
    def from_batch(batch: pa.RecordBatch, first_index: int) -> EncodedChunk:
        tokens, offsets = flat_lists(batch.column(0))
        lines = batch.column(1).to_numpy()
        return EncodedChunk(
            offsets.astype(np.int32),
            tokens.indices.to_numpy(),
            tokens.dictionary,
            lines,
            np.arange(first_index, first_index + len(lines), dtype=np.int64),
        )

    def counts(self, rows: np.ndarray) -> np.ndarray:
        """``(D,)`` occurrences of each dictionary entry in the sentences ``rows`` (a bool mask)."""
        ids = self.ids if rows.all() else self.ids[np.repeat(rows, np.diff(self.offsets))]
        return np.bincount(ids, minlength=len(self.dictionary))


@dataclass(frozen=True)
class FileTask:
    """What a worker needs to read one file the same way in both passes."""

    file: InputFile
    cfg: PrepareConfig
    tokenizer: dict[str, Any]
    heldout_by_fraction: bool  # text corpora without heldout files: a seeded fraction of sentences
    tokens: Path  # pass 1's spill of the encoded sentences, read by pass 2

    def heldout_rows(self, index: np.ndarray) -> np.ndarray:
        """(n,) bool: which of the sentences ``index`` belong to the heldout split."""
        if self.file.role == "heldout":
            return np.ones(len(index), dtype=bool)
        if not self.heldout_by_fraction:
            return np.zeros(len(index), dtype=bool)
        return heldout_mask(self.cfg.seed, self.file.index, index, self.cfg.heldout_fraction)

    def read(self, stats: FileStats) -> Iterator[EncodedChunk]:
        """Tokenize and encode the input file, block by block."""
        tokenizer = Tokenizer.from_manifest(self.tokenizer)
        for chunk in read_sentences(self.file.path, tokenizer, self.cfg, stats):
            yield EncodedChunk.encode(chunk)

    def reread(self) -> Iterator[EncodedChunk]:
        """Pass 1's spill if it is there, else the input file read again."""
        if not self.tokens.is_file():
            yield from self.read(FileStats())
            return
        next_index = 0
        with pa.OSFile(str(self.tokens)) as source:
            for batch in pa.ipc.open_stream(source):
                chunk = EncodedChunk.from_batch(batch, next_index)
                next_index += len(chunk.lines)
                yield chunk


class _TokenSpill:
    """Writes a file's encoded blocks under a temporary name, renamed into place when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sink = pa.OSFile(str(self.temporary), "wb")
        self.writer = pa.ipc.new_stream(self.sink, TOKENS_SCHEMA)

    def __enter__(self) -> _TokenSpill:
        return self

    def write(self, chunk: EncodedChunk) -> None:
        self.writer.write_batch(chunk.to_batch())

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.writer.close()
        self.sink.close()
        if kind is None:
            os.replace(self.temporary, self.path)
        else:
            self.temporary.unlink(missing_ok=True)


@dataclass
class FileCounts:
    """Pass-1 result of one file: type counts and sizes per split, and what was skipped."""

    file: InputFile
    stats: FileStats
    counts: pa.Table  # COUNT_SCHEMA; first_seen counts entries of the file's block dictionaries
    num_sentences: dict[str, int] = field(default_factory=dict)


def count_file(task: FileTask) -> FileCounts:
    """Pass 1 on one file: word-type counts per split, and the spill of its encoded sentences."""
    stats = FileStats()
    counts = TypeCounts()
    sentences = {"train": 0, "heldout": 0}
    first_seen = 0  # a block's dictionary is in first-occurrence order: keys run on over blocks
    with _TokenSpill(task.tokens) as spill:
        for chunk in task.read(stats):
            spill.write(chunk)
            heldout = task.heldout_rows(chunk.index)
            keys = np.arange(first_seen, first_seen + len(chunk.dictionary), dtype=np.int64)
            first_seen += len(chunk.dictionary)
            for split, rows in (("train", ~heldout), ("heldout", heldout)):
                if rows.any():
                    counts.add(chunk.dictionary, chunk.counts(rows), keys, split)
                    sentences[split] += int(rows.sum())
    return FileCounts(task.file, stats, counts.table(), sentences)


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


def vocab_with_marker_counts(vocab: Vocabulary, num_sentences: int, num_oov: int) -> Vocabulary:
    """Counts for ``vocab_counts.tsv``: markers once per sentence, ``<UNK>`` per OOV token."""
    counts = vocab.counts.copy()
    counts[BOS_ID] = counts[EOS_ID] = num_sentences
    counts[UNK_ID] += num_oov
    return Vocabulary(tokens=vocab.tokens, counts=counts)


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


def _type_index(type_tokens: Path) -> TypeIndex:
    """The type tokens, read and hashed once per worker process and version of the file.

    Keyed by size and mtime too: a process that prepares twice into the same output (a resumed
    run with another vocabulary) must not reuse the previous table.
    """
    stat = type_tokens.stat()
    return _read_type_index(str(type_tokens), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=1)
def _read_type_index(path: str, size: int, mtime_ns: int) -> TypeIndex:
    return TypeIndex(read_type_tokens(Path(path)))


@dataclass(frozen=True)
class EncodeTask:
    """Pass 2 on one file: its heldout parts and/or its training spill."""

    read: FileTask
    type_tokens: Path  # the type order, or word_types.parquet (read_type_tokens)
    root: Path  # local dataset root: heldout parts are written under it
    heldout_parts: list[str]  # relative paths of this file's heldout parts, in order
    spill_dir: Path | None  # where the training rows go (None: not needed)
    num_train_shards: int


@dataclass(frozen=True)
class EncodedFile:
    """Pass-2 result of one file: the heldout parts it wrote (its training rows are spilled)."""

    file: InputFile
    heldout_parts: list[ShardInfo]


def encode_file(task: EncodeTask) -> EncodedFile:
    """Encode one file: write its heldout parts and spill its training rows by shard."""
    cfg, file_index = task.read.cfg, task.read.file.index
    type_index = _type_index(task.type_tokens)
    parts = _HeldoutParts(task.root, task.heldout_parts, task.read.file.name, cfg)
    spill = ShardSpill(task.spill_dir) if task.spill_dir else None
    try:
        for chunk in task.read.reread():
            types = np.take(type_index.type_ids(chunk.dictionary), chunk.ids)
            heldout = task.read.heldout_rows(chunk.index)
            table = sentence_table(types, chunk.offsets)
            if task.heldout_parts and heldout.any():
                parts.write(
                    table if heldout.all() else table.filter(pa.array(heldout)),
                    chunk.lines[heldout],
                )
            if spill is not None and not heldout.all():
                rows = np.flatnonzero(~heldout)
                shards = train_shard_of(
                    cfg.seed, file_index, chunk.index[rows], task.num_train_shards
                )
                spill.write(table["types"].chunk(0), rows, shards)
        written = parts.close()
        if spill is not None:
            spill.close()
        task.read.tokens.unlink(missing_ok=True)
        return EncodedFile(task.read.file, written)
    finally:
        parts.abort()
        if spill is not None:
            spill.abort()


class _HeldoutParts:
    """Writes a file's heldout rows in source order, cut every ``sentences_per_shard`` rows."""

    def __init__(self, root: Path, names: list[str], source: str, cfg: PrepareConfig) -> None:
        self.root, self.names, self.source, self.cfg = root, names, source, cfg
        self.pending: list[pa.Table] = []
        self.num_pending = 0
        self.written: list[ShardInfo] = []

    def write(self, table: pa.Table, lines: np.ndarray) -> None:
        num = len(table)
        source = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(num, dtype=np.int32)), pa.array([self.source])
        )
        table = table.append_column(HELDOUT_SCHEMA.field("source_file"), source)
        table = table.append_column(HELDOUT_SCHEMA.field("line"), pa.array(lines, pa.int64()))
        self.pending.append(table)
        self.num_pending += num
        while self.num_pending >= self.cfg.sentences_per_shard:
            self._flush(self.cfg.sentences_per_shard)

    def _flush(self, num_rows: int) -> None:
        table = pa.concat_tables(self.pending).combine_chunks()
        rest = table.slice(num_rows)
        self.pending, self.num_pending = ([rest], len(rest)) if len(rest) else ([], 0)
        name = self.names[len(self.written)]
        self.written.append(
            write_shard(table.slice(0, num_rows), self.root, name, self.cfg, [self.source])
        )

    def close(self) -> list[ShardInfo]:
        if self.num_pending:
            self._flush(self.num_pending)
        if len(self.written) != len(self.names):
            raise RuntimeError(f"{self.source}: expected {len(self.names)} heldout parts")
        return self.written

    def abort(self) -> None:
        self.pending = []
