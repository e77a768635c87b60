"""Arrow string arrays as the raw buffers the C module ``_token_hash`` reads and returns.

An Arrow ``string`` array is int32 offsets ``(n+1,)`` into one buffer of UTF-8 bytes; the C
passes take and give exactly those two buffers, so neither side copies a string.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def string_buffers(strings: pa.Array) -> tuple[np.ndarray, pa.Buffer]:
    """(int32 offsets of the array's own rows, data buffer) of a string array, slices included."""
    strings = strings.cast(pa.string())
    _, offsets, data = strings.buffers()
    start = strings.offset
    rows = np.frombuffer(offsets, dtype=np.int32)[start : start + len(strings) + 1]
    return rows, data if data is not None else pa.py_buffer(b"")


def strings_from_buffers(offsets: bytes, data: bytes) -> pa.StringArray:
    """The string array of int32 ``offsets`` ``(n+1,)`` into ``data``, without a copy."""
    num = len(offsets) // 4 - 1
    return pa.StringArray.from_buffers(num, pa.py_buffer(offsets), pa.py_buffer(data))
