"""``elmo embed --format hdf5``: the shards gathered into one file in AllenNLP's ``elmo`` layout.

A dataset per sentence id, and ``sentence_to_index``, the JSON map from each stripped line to its
id, so code that reads AllenNLP's files reads this one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import h5py

from pipelines.common.console import console_progress
from pipelines.embed.embedding_shards import ID_COLUMN, TEXT_COLUMN, table_vectors
from pipelines.embed.output import EmbeddingsDir
from pipelines.embed.vectors import Output

HDF5_FILE = "embeddings.hdf5"
INDEX_DATASET = "sentence_to_index"


def write_hdf5(
    out: EmbeddingsDir, shards: Sequence[str], output: Output, num_sentences: int
) -> str:
    """Gather ``shards`` (in order) into ``out``'s :data:`HDF5_FILE`; returns its location."""

    def write(path: Path) -> None:
        sentence_to_index: dict[str, str] = {}
        with (
            h5py.File(path, "w") as hdf5,
            console_progress(num_sentences, "writing HDF5", unit="sentence") as bar,
        ):
            for name in shards:
                table = out.read_table(name)
                ids = table.column(ID_COLUMN).to_pylist()
                texts = table.column(TEXT_COLUMN).to_pylist()
                for sentence_id, text, vectors in zip(
                    ids, texts, table_vectors(table, output), strict=True
                ):
                    key = str(sentence_id)
                    hdf5.create_dataset(key, vectors.shape, dtype=vectors.dtype, data=vectors)
                    sentence_to_index[text] = key
                bar.update(len(ids))
            index = hdf5.create_dataset(INDEX_DATASET, (1,), dtype=h5py.special_dtype(vlen=str))
            index[0] = json.dumps(sentence_to_index)

    out.write(HDF5_FILE, write)
    return out.join(HDF5_FILE)
