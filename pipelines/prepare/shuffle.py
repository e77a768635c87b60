"""The training-set shuffle: scatter rows to per-shard spills, then gather and permute each shard.

Rows move as flat Arrow list arrays (Arrow's ``take``), never as Python objects. Only type ids are
stored: readers derive the targets from them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo
from elmo_core.data.shards import (
    ID_LIST_TYPE,
    TRAIN_SCHEMA,
    shard_permutation,
    write_parquet,
)

SPILL_SCHEMA = pa.schema([("types", pa.list_(pa.int32()))])


def write_shard(
    table: pa.Table, root: Path, name: str, cfg: PrepareConfig, sources: list[str] | None = None
) -> ShardInfo:
    """Write one final shard atomically and describe it for the manifest."""
    digest = write_parquet(table, root / name, cfg.sentences_per_row_group)
    num_groups = pq.ParquetFile(root / name).metadata.num_row_groups
    num_tokens = int(pc.sum(pc.list_value_length(table["types"])).as_py() or 0) if len(table) else 0
    return ShardInfo(
        path=name,
        sha256=digest,
        num_sentences=len(table),
        num_tokens=num_tokens,
        num_row_groups=num_groups,
        source_files=sources or [],
    )


class ShardSpill:
    """Per-shard Arrow IPC files of one input file's training rows; renamed into place on close."""

    def __init__(self, final_dir: Path) -> None:
        self.final_dir = final_dir
        self.temporary = final_dir.with_name(final_dir.name + ".tmp")
        shutil.rmtree(self.temporary, ignore_errors=True)
        self.temporary.mkdir(parents=True)
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

    def write(self, sentences: pa.ListArray, rows: np.ndarray, shards: np.ndarray) -> None:
        """Append ``sentences[rows]`` to their ``shards``, in the order given."""
        # NumPy's stable sort is a radix sort on 16-bit keys, several times faster than on int64.
        top = int(shards.max())
        narrow = shards.astype(np.uint16) if top < 1 << 16 else shards
        by_shard = np.argsort(narrow, kind="stable")
        grouped = sentences.take(pa.array(rows[by_shard]))
        bounds = np.searchsorted(shards[by_shard], np.arange(top + 2))
        for shard in np.flatnonzero(np.diff(bounds)):
            start, stop = bounds[shard], bounds[shard + 1]
            batch = pa.record_batch([grouped.slice(start, stop - start)], schema=SPILL_SCHEMA)
            self._writer(int(shard)).write_batch(batch)

    def _writer(self, shard: int) -> pa.ipc.RecordBatchFileWriter:
        writer = self.writers.get(shard)
        if writer is None:
            path = self.temporary / f"shard-{shard:05d}.arrow"
            writer = self.writers[shard] = pa.ipc.new_file(path, SPILL_SCHEMA)
        return writer

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
    """Read the shard's spilled rows in file order, shuffle them (seeded), write."""
    pieces = []
    for spill_dir in task.spill_dirs:
        path = spill_dir / f"shard-{task.shard:05d}.arrow"
        if path.exists():
            with pa.OSFile(str(path)) as source:
                pieces.append(pa.ipc.open_file(source).read_all())
    table = pa.concat_tables(pieces) if pieces else SPILL_SCHEMA.empty_table()
    order = shard_permutation(task.cfg.seed, task.shard, len(table))
    shuffled = table["types"].combine_chunks().take(pa.array(order))
    types = pa.ListArray.from_arrays(shuffled.offsets, shuffled.values, type=ID_LIST_TYPE)
    return write_shard(
        pa.Table.from_arrays([types], schema=TRAIN_SCHEMA), task.root, task.name, task.cfg
    )
