"""The input of ``elmo embed``: lines of text cut into chunks, the unit of work and of resumption.

The driver reads every line before Ray starts, so bad UTF-8 is a DataError naming file and line. A
chunk is a byte range of one file, so every node must see the input at the same path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elmo_core.errors import DataError
from pipelines.common.console import console_progress

PROGRESS_BYTES = 1 << 20  # update the bar once per MiB read, not once per line
DEFAULT_SENTENCES_PER_SHARD = 10_000  # sentences per chunk
DEFAULT_BATCH_SIZE = 64  # sentences per forward pass, within a chunk


@dataclass(frozen=True)
class Chunk:
    """``num_sentences`` non-empty lines of ``path``, bytes ``[start, stop)``; the first
    line's sentence id is ``first_id`` and the ids count every line, empty ones included."""

    index: int
    path: str
    start: int
    stop: int
    first_id: int
    num_sentences: int


@dataclass(frozen=True)
class InputFile:
    """An input file as the output records it: a changed input is a different output."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class InputPlan:
    """The input files, their chunks and what the scan counted."""

    files: list[InputFile]
    chunks: list[Chunk]
    num_sentences: int
    num_empty_lines: int


class _Chunker:
    """Accumulates lines of one file into chunks of ``size`` sentences."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chunks: list[Chunk] = []
        self._path = ""
        self._count = self._start = self._stop = self._first_id = 0

    def add(self, path: Path, offset: int, stop: int, line_id: int) -> None:
        """A non-empty line at bytes ``[offset, stop)`` of ``path``."""
        if self._count == 0:
            self._path, self._start, self._first_id = str(path), offset, line_id
        self._count += 1
        self._stop = stop
        if self._count == self.size:
            self.close()

    def close(self) -> None:
        """End the current chunk (at a chunk's size, or at the end of a file)."""
        if self._count:
            chunk = Chunk(
                len(self.chunks), self._path, self._start, self._stop, self._first_id, self._count
            )
            self.chunks.append(chunk)
        self._count = 0


def plan_chunks(files: Sequence[Path], sentences_per_chunk: int) -> InputPlan:
    """Read every line of ``files`` once: check it decodes, count it, and cut the chunks."""
    chunker = _Chunker(sentences_per_chunk)
    described: list[InputFile] = []
    line_id = num_empty = unreported = 0
    total = sum(path.stat().st_size for path in files)
    with console_progress(total, "reading input") as bar:
        for path in files:
            offset, digest = 0, hashlib.sha256()  # hashed as it is read, not read again
            with open(path, "rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    digest.update(raw)
                    if _decoded(raw, path, number).strip():
                        chunker.add(path, offset, offset + len(raw), line_id)
                    else:
                        num_empty += 1
                    offset += len(raw)
                    line_id += 1
                    unreported += len(raw)
                    if unreported >= PROGRESS_BYTES:
                        bar.update(unreported)
                        unreported = 0
            chunker.close()
            described.append(InputFile(path.name, offset, digest.hexdigest()))
        bar.update(unreported)
    num_sentences = sum(chunk.num_sentences for chunk in chunker.chunks)
    if not num_sentences:
        raise DataError("the input holds no sentences (every line is empty)", path=str(files[0]))
    return InputPlan(described, chunker.chunks, num_sentences, num_empty)


def read_chunk(chunk: Chunk) -> tuple[list[int], list[str]]:
    """The chunk's sentence ids and texts (each line stripped, as AllenNLP's ``elmo`` reads
    it), empty lines skipped as :func:`plan_chunks` skipped them."""
    with open(chunk.path, "rb") as handle:
        handle.seek(chunk.start)
        data = handle.read(chunk.stop - chunk.start)
    ids: list[int] = []
    texts: list[str] = []
    for offset, raw in enumerate(data.split(b"\n")):
        text = raw.decode("utf-8").strip()
        if text:
            ids.append(chunk.first_id + offset)
            texts.append(text)
    if len(ids) != chunk.num_sentences:
        raise DataError(
            f"changed since the run started: {len(ids)} sentences in bytes {chunk.start}-"
            f"{chunk.stop}, {chunk.num_sentences} when it was read",
            path=chunk.path,
        )
    return ids, texts


def _decoded(raw: bytes, path: Path, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"not UTF-8 (byte {err.start + 1} of the line: {raw[err.start : err.start + 1]!r})",
            path=str(path),
            line=number,
        ) from None
