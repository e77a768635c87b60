"""Rows of a list column held flat (offsets + values), taken in a new order.

The prepare stage's shuffle moves every training sentence twice: grouped by shard in pass 2,
then into its shuffled order in the shard (:mod:`pipelines.prepare.shuffle`). Arrow's ``take``
on list columns cost several times as much as moving the flat arrays. Two implementations give
the same arrays: the C module ``_rows`` (built at install time when a C compiler is there), one
copy per row; and NumPy, the fallback, which builds a source index for every value.
"""

from __future__ import annotations

import numpy as np

try:  # optional at install time: see pyproject.toml's ext-modules
    from elmo_core.data._rows import take_rows
except ImportError:  # pragma: no cover - exercised where no C compiler was available
    take_rows = None


def permute_rows(
    offsets: np.ndarray, values: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``order`` of int32 ``values`` cut at ``offsets`` ``(n+1,)``: (offsets ``(m+1,)``
    int64 from 0, values)."""
    if take_rows is None or values.dtype != np.int32:
        return permute_rows_numpy(offsets, values, order)
    new_offsets, new_values = take_rows(
        np.ascontiguousarray(offsets, dtype=np.int64),
        np.ascontiguousarray(values),
        np.ascontiguousarray(order, dtype=np.int64),
    )
    return np.frombuffer(new_offsets, dtype=np.int64), np.frombuffer(new_values, dtype=np.int32)


def permute_rows_numpy(
    offsets: np.ndarray, values: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`permute_rows` with NumPy: a source index for every value, then one gather."""
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    shift = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths)
    return new_offsets, values[shift + np.arange(new_offsets[-1])]
