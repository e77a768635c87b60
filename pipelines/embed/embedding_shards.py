"""The Parquet shards of ``elmo embed``: one per input chunk, a row per sentence.

``vectors`` nest as the output's shape (:mod:`pipelines.embed.vectors`), layer-major for ``all``
as AllenNLP's ``(3, num_tokens, 1024)``; each column is built from one flat NumPy array, never from
Python lists of floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from pipelines.embed.vectors import Output

Dtype = Literal["float16", "float32"]
DTYPES: tuple[Dtype, ...] = ("float16", "float32")
ID_COLUMN = "sentence_id"
TEXT_COLUMN = "text"
TOKENS_COLUMN = "tokens"
VECTORS_COLUMN = "vectors"
SHARD_PREFIX = "part-"
SHARD_SUFFIX = ".parquet"


def shard_name(chunk_index: int) -> str:
    """``part-000012.parquet``: shards sort in chunk order."""
    return f"{SHARD_PREFIX}{chunk_index:06d}{SHARD_SUFFIX}"


def vectors_table(
    ids: Sequence[int],
    texts: Sequence[str],
    tokens: Sequence[Sequence[str]],
    vectors: Sequence[np.ndarray],
    output: Output,
    dtype: Dtype,
) -> pa.Table:
    """One shard's rows; ``vectors`` as :func:`~pipelines.embed.vectors.embed_sentences` gives
    them (at least one sentence). The ``vectors`` column per ``output``, each vector a
    ``fixed_size_list<float, 2P>``: ``all`` layers × tokens, ``fixed_size_list<list<…>, L>``;
    ``top`` and ``mix`` tokens, ``list<…>``; ``mean`` the vector itself."""
    dim = vectors[0].shape[-1]
    flat = np.concatenate([v.reshape(-1) for v in vectors]).astype(dtype, copy=False)
    values = pa.FixedSizeListArray.from_arrays(pa.array(flat), dim)  # one per token (or sentence)
    if output == "mean":
        column: pa.Array = values
    else:
        lengths = np.array([v.shape[-2] for v in vectors], dtype=np.int64)  # T_i
        num_layers = vectors[0].shape[0] if output == "all" else 1
        per_list = np.repeat(lengths, num_layers)  # one list per (sentence, layer)
        offsets = np.concatenate([[0], np.cumsum(per_list)]).astype(np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), values)
        if output == "all":
            column = pa.FixedSizeListArray.from_arrays(column, num_layers)
    return pa.table(
        {
            ID_COLUMN: pa.array(ids, type=pa.int64()),
            TEXT_COLUMN: pa.array(texts, type=pa.string()),
            TOKENS_COLUMN: pa.array(tokens, type=pa.list_(pa.string())),
            VECTORS_COLUMN: column,
        }
    )


def table_vectors(table: pa.Table, output: Output) -> list[np.ndarray]:
    """The ``vectors`` column back as one array per row, in the shard's dtype."""
    column = table.column(VECTORS_COLUMN).combine_chunks()
    if output == "mean":
        return list(_floats(column.flatten(), column.type.list_size))
    if output == "all":
        num_layers = column.type.list_size
        lists = column.flatten()  # (sentence, layer) lists of token vectors
        lengths = lists.value_lengths().to_numpy()[::num_layers]  # T_i
        flat = _floats(lists.flatten().flatten(), lists.type.value_type.list_size)
        bounds = np.cumsum(lengths * num_layers)[:-1]
        return [
            part.reshape(num_layers, length, flat.shape[-1])
            for part, length in zip(np.split(flat, bounds), lengths, strict=True)
        ]
    lengths = column.value_lengths().to_numpy()
    flat = _floats(column.flatten().flatten(), column.type.value_type.list_size)
    return np.split(flat, np.cumsum(lengths)[:-1])


def _floats(values: pa.Array, dim: int) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False).reshape(-1, dim)
