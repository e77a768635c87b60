"""Prepare's input files, how both passes read one, and pass 1: counting each file's word types.

Arrow dictionary-encodes each block's tokens, so pass 1 counts distinct tokens only; it spills the
encoded blocks so that pass 2 reads them back instead of tokenizing again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elmo_core.config import PrepareConfig
from elmo_core.data.shards import FileStats, SentenceChunk, flat_lists, heldout_mask, read_sentences
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.type_counts import TypeCounts

TOKENS_SCHEMA = pa.schema(
    [("tokens", pa.list_(pa.dictionary(pa.int32(), pa.string()))), ("line", pa.int64())]
)


@dataclass(frozen=True)
class SourceFile:
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

    file: SourceFile
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


class TokenSpill:
    """Writes a file's encoded blocks under a temporary name, renamed into place when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sink = pa.OSFile(str(self.temporary), "wb")
        self.writer = pa.ipc.new_stream(self.sink, TOKENS_SCHEMA)

    def __enter__(self) -> TokenSpill:
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


# --- pass 1 ---------------------------------------------------------------------------------------


@dataclass
class FileCounts:
    """Pass-1 result of one file: type counts and sizes per split, and what was skipped."""

    file: SourceFile
    stats: FileStats
    counts: pa.Table  # COUNT_SCHEMA; first_seen counts entries of the file's block dictionaries
    num_sentences: dict[str, int] = field(default_factory=dict)


def count_file(task: FileTask) -> FileCounts:
    """Pass 1 on one file: word-type counts per split, and the spill of its encoded sentences."""
    stats = FileStats()
    counts = TypeCounts()
    sentences = {"train": 0, "heldout": 0}
    first_seen = 0  # a block's dictionary is in first-occurrence order: keys run on over blocks
    with TokenSpill(task.tokens) as spill:
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
