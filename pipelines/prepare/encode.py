"""Pass 2 of prepare, one task per input file: type ids, heldout parts, training rows by shard.

Neither pass holds more than a block of text, one shard and the type table in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo
from elmo_core.data.shards import HELDOUT_SCHEMA, TypeIndex, sentence_table, train_shard_of
from pipelines.prepare.inputs import FileTask, SourceFile
from pipelines.prepare.shuffle import ShardSpill, write_shard
from pipelines.prepare.word_types import read_type_tokens


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

    file: SourceFile
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
