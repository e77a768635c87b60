"""Pass 1 of prepare, one task per input file: word-type counts per split, and the file's spill.

:func:`count_file` reads the file block by block (:meth:`FileTask.read`), counts each block's
dictionary entries per split from its indices, and spills the encoded blocks for pass 2. The
parent sums the files' counts (:class:`~elmo_core.text.type_counts.TypeCounts`), builds the
vocabulary and the type order (:mod:`pipelines.prepare.word_types`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from elmo_core.data.shards import FileStats
from elmo_core.text.type_counts import TypeCounts
from elmo_core.text.vocab import BOS_ID, EOS_ID, UNK_ID, Vocabulary
from pipelines.prepare.inputs import FileTask, InputFile, TokenSpill


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


def vocab_with_marker_counts(vocab: Vocabulary, num_sentences: int, num_oov: int) -> Vocabulary:
    """Counts for ``vocab_counts.tsv``: markers once per sentence, ``<UNK>`` per OOV token."""
    counts = vocab.counts.copy()
    counts[BOS_ID] = counts[EOS_ID] = num_sentences
    counts[UNK_ID] += num_oov
    return Vocabulary(tokens=vocab.tokens, counts=counts)
