"""``elmo embed --format hdf5``: the shards gathered into one file laid out as AllenNLP's
``elmo`` command wrote it, so the code that reads those files reads this one.

AllenNLP (``allennlp/commands/elmo.py``, ``embed_file``) writes one dataset per sentence, named
by the sentence's index as a string, of shape ``(3, num_tokens, 1024)`` with ``--all`` and
``(num_tokens, 1024)`` with ``--top`` or ``--average``; then a dataset ``sentence_to_index`` of
shape ``(1,)`` and variable-length string type holding ``json.dumps`` of a dict from each
sentence (its stripped line) to its index string, the last one winning for a repeated sentence.
Here the index is the sentence id (its input line), the shapes are ``(L, T, 2P)``, ``(T, 2P)``,
or ``(2P,)`` for ``mean``, and the dtype is ``--dtype`` (AllenNLP wrote float32).

The file is written by the driver once every shard exists, under a temporary name and renamed
(or sent as one object), so it is there whole or not at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import h5py

from pipelines.common.console_progress import console_progress
from pipelines.embed.output import EmbeddingsDir
from pipelines.embed.shards import ID_COLUMN, TEXT_COLUMN, table_vectors
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
    return out.location(HDF5_FILE)
