"""The work of the prepare stage: picklable tasks run in worker processes (a file or shard each).

Pass 1, :func:`count_file`: tokenize one input file block by block and count its word types per
split with Arrow's ``value_counts``. The parent merges the counts (:func:`merge_counts`), builds the
vocabulary and the word-type table (:func:`build_word_types`).

Pass 2, :func:`encode_file`: tokenize the file again and map tokens to ids with
:func:`elmo_core.data.shards.encode_tokens`; heldout rows go, in source order, to the file's heldout
parts; training rows are scattered to per-shard spill files by a seeded hash of the sentence.
:func:`gather_shard` then sorts one shard's rows by a second seeded hash (the shuffle) and writes
it. Neither pass holds more than a block of text, one shard, and the type table in memory.

All outputs are written under a temporary name and renamed; a spill directory is renamed into
place only when complete, so a crash never leaves a file that looks finished.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo
from elmo_core.data.shards import (
    HELDOUT_SCHEMA,
    WORD_TYPES_SCHEMA,
    FileStats,
    SentenceChunk,
    char_id_rows,
    encode_tokens,
    fixed_size_char_ids,
    flat_lists,
    heldout_mask,
    read_sentences,
    sentence_table,
    shuffle_key,
    train_shard_of,
    write_parquet,
)
from elmo_core.text.char_ids import MAX_TOKEN_BYTES
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.vocab import BOS_ID, EOS_ID, UNK_ID, Vocabulary

SPILL_SCHEMA = pa.schema(
    [("types", pa.list_(pa.int32())), ("targets", pa.list_(pa.int32())), ("key", pa.uint64())]
)
COUNT_SCHEMA = pa.schema([("token", pa.string()), ("count", pa.int64())])


@dataclass(frozen=True)
class InputFile:
    """One input file: its position in the corpus (hash salt), local path, name and role."""

    index: int
    path: Path
    name: str  # relative to the corpus root: recorded in manifests and heldout rows
    role: Literal["train", "heldout"]


@dataclass(frozen=True)
class FileTask:
    """What a worker needs to read one file the same way in both passes."""

    file: InputFile
    cfg: PrepareConfig
    tokenizer: dict[str, Any]
    heldout_by_fraction: bool  # text corpora without heldout files: a seeded fraction of sentences

    def heldout_rows(self, chunk: SentenceChunk) -> np.ndarray:
        """(n,) bool: which of the chunk's sentences belong to the heldout split."""
        if self.file.role == "heldout":
            return np.ones(len(chunk.sentences), dtype=bool)
        if not self.heldout_by_fraction:
            return np.zeros(len(chunk.sentences), dtype=bool)
        return heldout_mask(self.cfg.seed, self.file.index, chunk.index, self.cfg.heldout_fraction)

    def read(self, stats: FileStats) -> Any:
        tokenizer = Tokenizer.from_manifest(self.tokenizer)
        return read_sentences(self.file.path, tokenizer, self.cfg, stats)


@dataclass
class FileCounts:
    """Pass-1 result of one file: type counts and sizes per split, and what was skipped."""

    file: InputFile
    stats: FileStats
    counts: dict[str, pa.Table]  # split → (token, count)
    num_sentences: dict[str, int] = field(default_factory=dict)


def count_file(task: FileTask) -> FileCounts:
    """Pass 1 on one file: word-type counts per split (vectorised ``value_counts``)."""
    stats = FileStats()
    parts: dict[str, list[pa.Table]] = {"train": [], "heldout": []}
    sentences = {"train": 0, "heldout": 0}
    for chunk in task.read(stats):
        heldout = task.heldout_rows(chunk)
        for split, mask in (("train", ~heldout), ("heldout", heldout)):
            if not mask.any():
                continue
            chosen = chunk.sentences if mask.all() else chunk.sentences.filter(pa.array(mask))
            values, _ = flat_lists(chosen)
            counted = pc.value_counts(values)
            parts[split].append(
                pa.Table.from_arrays(
                    [counted.field("values"), counted.field("counts")], schema=COUNT_SCHEMA
                )
            )
            sentences[split] += len(chosen)
            if len(parts[split]) >= 8:
                parts[split] = [merge_counts(parts[split])]
    counts = {split: merge_counts(tables) for split, tables in parts.items()}
    return FileCounts(task.file, stats, counts, sentences)


def merge_counts(tables: list[pa.Table]) -> pa.Table:
    """Sum (token, count) tables by token."""
    if not tables:
        return COUNT_SCHEMA.empty_table()
    if len(tables) == 1:
        return tables[0]
    summed = pa.concat_tables(tables).group_by("token").aggregate([("count", "sum")])
    return pa.Table.from_arrays([summed["token"], summed["count_sum"]], schema=COUNT_SCHEMA)


@dataclass(frozen=True)
class WordTypeSummary:
    """Per-split totals the manifest needs that come from the type counts."""

    num_types: int
    num_oov_tokens: dict[str, int]
    truncated_tokens: dict[str, int]


def build_word_types(
    train: pa.Table, heldout: pa.Table, vocab: Vocabulary
) -> tuple[pa.Table, WordTypeSummary]:
    """The word-type table: vocabulary entries first (type id = vocab id), then OOV types.

    OOV types are ordered by descending total count, ties by UTF-8 bytes (deterministic).
    """
    num_train, num_heldout = len(train), len(heldout)
    both = pa.concat_tables(
        [
            pa.table(
                {
                    "token": train["token"],
                    "count": train["count"],
                    "heldout": pa.nulls(num_train, pa.int64()),
                }
            ),
            pa.table(
                {
                    "token": heldout["token"],
                    "count": pa.nulls(num_heldout, pa.int64()),
                    "heldout": heldout["count"],
                }
            ),
        ]
    )
    seen = both.group_by("token").aggregate([("count", "sum"), ("heldout", "sum")])
    seen = pa.table(
        {
            "token": seen["token"],
            "count": pc.fill_null(seen["count_sum"], 0),
            "heldout_count": pc.fill_null(seen["heldout_sum"], 0),
        }
    )
    vocab_tokens = vocab.as_arrow()
    oov = seen.filter(pc.invert(pc.is_in(seen["token"], value_set=vocab_tokens)))
    oov = oov.append_column("total", pc.add(oov["count"], oov["heldout_count"]))
    oov = oov.take(pc.sort_indices(oov, [("total", "descending"), ("token", "ascending")]))
    where = pc.index_in(vocab_tokens, value_set=seen["token"])
    tokens = pa.concat_arrays([vocab_tokens, _array(oov["token"])])
    num_types = len(tokens)
    type_ids = np.arange(num_types, dtype=np.int32)
    table = pa.Table.from_arrays(
        [
            pa.array(type_ids),
            tokens,
            _concat(pc.fill_null(pc.take(seen["count"], where), 0), oov["count"]),
            _concat(pc.fill_null(pc.take(seen["heldout_count"], where), 0), oov["heldout_count"]),
            pa.array(np.where(type_ids < len(vocab), type_ids, np.int32(UNK_ID))),
            fixed_size_char_ids(char_id_rows(tokens)),
        ],
        schema=WORD_TYPES_SCHEMA,
    )
    long = pc.greater(pc.binary_length(seen["token"]), MAX_TOKEN_BYTES)
    summary = WordTypeSummary(
        num_types=num_types,
        num_oov_tokens={"train": _sum(oov["count"]), "heldout": _sum(oov["heldout_count"])},
        truncated_tokens={
            "train": _sum(seen["count"].filter(long)),
            "heldout": _sum(seen["heldout_count"].filter(long)),
        },
    )
    return table, summary


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _concat(*columns: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.concat_arrays([_array(column).cast(pa.int64()) for column in columns])


def _sum(column: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(column).as_py() or 0)


def vocab_with_marker_counts(vocab: Vocabulary, num_sentences: int, num_oov: int) -> Vocabulary:
    """Counts for ``vocab_counts.tsv``: markers once per sentence, ``<UNK>`` per OOV token."""
    counts = vocab.counts.copy()
    counts[BOS_ID] = counts[EOS_ID] = num_sentences
    counts[UNK_ID] += num_oov
    return Vocabulary(tokens=vocab.tokens, counts=counts)


@lru_cache(maxsize=1)
def _type_tokens(word_types_path: str) -> pa.Array:
    """The type table's tokens, read once per worker process."""
    return pq.read_table(word_types_path, columns=["token"])["token"].combine_chunks()


@dataclass(frozen=True)
class EncodeTask:
    """Pass 2 on one file: its heldout parts and/or its training spill."""

    read: FileTask
    word_types: Path
    vocab_size: int
    root: Path  # local dataset root: heldout parts are written under it
    heldout_parts: list[str]  # relative paths of this file's heldout parts, in order
    spill_dir: Path | None  # where the training rows go (None: not needed)
    num_train_shards: int


def encode_file(task: EncodeTask) -> list[ShardInfo]:
    """Encode one file; return the heldout parts written (training rows go to the spill)."""
    cfg = task.read.cfg
    type_tokens = _type_tokens(str(task.word_types))
    parts = _HeldoutParts(task.root, task.heldout_parts, task.read.file.name, cfg)
    spill = _Spill(task.spill_dir, task.num_train_shards) if task.spill_dir else None
    try:
        for chunk in task.read.read(FileStats()):
            values, offsets = flat_lists(chunk.sentences)
            types, targets = encode_tokens(values, type_tokens, task.vocab_size)
            table = sentence_table(types, targets, offsets)
            heldout = task.read.heldout_rows(chunk)
            if task.heldout_parts and heldout.any():
                parts.write(table.filter(pa.array(heldout)), chunk.lines[heldout])
            if spill is not None and not heldout.all():
                keep = ~heldout
                index = chunk.index[keep]
                file_index = task.read.file.index
                spill.write(
                    table.filter(pa.array(keep)) if not keep.all() else table,
                    train_shard_of(cfg.seed, file_index, index, task.num_train_shards),
                    shuffle_key(cfg.seed, file_index, index),
                )
        written = parts.close()
        if spill is not None:
            spill.close()
        return written
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


def write_shard(
    table: pa.Table, root: Path, name: str, cfg: PrepareConfig, sources: list[str] | None = None
) -> ShardInfo:
    """Write one final shard atomically and describe it for the manifest."""
    digest = write_parquet(table, root / name, cfg.sentences_per_row_group)
    num_groups = pq.ParquetFile(root / name).metadata.num_row_groups
    num_tokens = _sum(pc.list_value_length(table["types"])) if len(table) else 0
    return ShardInfo(
        path=name,
        sha256=digest,
        num_sentences=len(table),
        num_tokens=num_tokens,
        num_row_groups=num_groups,
        source_files=sources or [],
    )


class _Spill:
    """Per-shard Arrow IPC files of one input file's training rows; renamed into place on close."""

    def __init__(self, final_dir: Path, num_shards: int) -> None:
        self.final_dir = final_dir
        self.temporary = final_dir.with_name(final_dir.name + ".tmp")
        shutil.rmtree(self.temporary, ignore_errors=True)
        self.temporary.mkdir(parents=True)
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

    def write(self, table: pa.Table, shards: np.ndarray, keys: np.ndarray) -> None:
        order = np.argsort(shards, kind="stable")
        table = table.take(pa.array(order)).append_column("key", pa.array(keys[order], pa.uint64()))
        bounds = np.searchsorted(shards[order], np.arange(shards.max() + 2))
        for shard in np.flatnonzero(np.diff(bounds)):
            writer = self.writers.get(int(shard))
            if writer is None:
                path = self.temporary / f"shard-{shard:05d}.arrow"
                writer = self.writers[int(shard)] = pa.ipc.new_file(path, SPILL_SCHEMA)
            writer.write_table(table.slice(bounds[shard], bounds[shard + 1] - bounds[shard]))

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        shutil.rmtree(self.final_dir, ignore_errors=True)
        self.temporary.rename(self.final_dir)

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.close()
        shutil.rmtree(self.temporary, ignore_errors=True)


@dataclass(frozen=True)
class GatherTask:
    """Collect one training shard from every file's spill, shuffle it, write it."""

    shard: int
    spill_dirs: list[Path]  # in file order
    root: Path
    cfg: PrepareConfig

    @property
    def name(self) -> str:
        return train_shard_name(self.shard)


def train_shard_name(shard: int) -> str:
    return f"train/part-{shard:05d}.parquet"


def gather_shard(task: GatherTask) -> ShardInfo:
    """Read the shard's spilled rows, sort them by their seeded key (the shuffle), write."""
    pieces = []
    for spill_dir in task.spill_dirs:
        path = spill_dir / f"shard-{task.shard:05d}.arrow"
        if path.exists():
            with pa.OSFile(str(path)) as source:
                pieces.append(pa.ipc.open_file(source).read_all())
    table = pa.concat_tables(pieces) if pieces else SPILL_SCHEMA.empty_table()
    table = table.take(pc.sort_indices(table["key"])).drop_columns(["key"])
    return write_shard(table.combine_chunks(), task.root, task.name, task.cfg)
