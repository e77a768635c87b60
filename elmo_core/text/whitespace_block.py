"""A raw block of UTF-8 lines split on whitespace as ``line.split()``, without decoding lines.

The 1B Word Benchmark is already tokenized, so preparing it is mostly this split and the
hashing of every token that follows. Two implementations give the same tokens and lines:

- :func:`split_block_compiled`, the C module ``_token_hash`` (``token_hash/split.c``, built at
  install time when a C compiler is there): one pass over the bytes that also dictionary-encodes
  the tokens, so they come back as a ``dictionary<int32, string>`` array and prepare skips its
  own hash. About 5x the NumPy path with Arrow's ``dictionary_encode`` after it.
- :func:`split_block_numpy`, NumPy over the bytes: separators are marked, tokens are the runs
  between them, gathered into one string array. The fallback where the module is not built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from elmo_core.text.string_buffers import strings_from_buffers

try:  # optional at install time: see pyproject.toml's ext-modules
    from elmo_core.text._token_hash import split_and_encode
except ImportError:  # pragma: no cover - exercised where no C compiler was available
    split_and_encode = None

# Python's str.split() separators beyond ASCII (" \t\n\v\f\r" and 0x1c-0x1f), as UTF-8.
_WIDE_SPACES = [
    *(chr(code).encode() for code in (0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)),
    *(chr(code).encode() for code in range(0x2000, 0x200B)),
]


@dataclass(frozen=True)
class BlockTokens:
    """A block's tokens, flat, and where each line's tokens start (a blank line has none)."""

    tokens: pa.Array  # (N,) every token in order: string, or dictionary<int32, string>
    line_offsets: np.ndarray  # (L+1,) int64: line i's tokens are tokens[o[i]:o[i+1]]


def split_whitespace_block(block: bytes) -> BlockTokens | None:
    """Lines (``\\n``-separated) of a raw block → tokens as ``line.split()``; None if not UTF-8.

    The compiled path checks the UTF-8 of the block's distinct tokens only (a few percent of its
    bytes): every byte is either in a whitespace character, which the C pass matches in full, or
    in a token, so the block is valid exactly when each distinct token is.
    """
    if split_and_encode is None:
        return split_block_numpy(block) if _is_utf8(block) else None
    tokens = split_block_compiled(block)
    try:
        tokens.tokens.dictionary.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return tokens


def _is_utf8(block: bytes) -> bool:
    """Arrow's SIMD UTF-8 check over the whole block."""
    offsets = pa.py_buffer(np.array([0, len(block)], np.int32))
    whole = pa.BinaryArray.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(block)])
    try:
        whole.cast(pa.string())
    except pa.ArrowInvalid:
        return False
    return True


def split_block_compiled(block: bytes) -> BlockTokens:
    """The C pass: tokens dictionary-encoded in first-occurrence order (as Arrow's encoder)."""
    if split_and_encode is None:
        raise RuntimeError("elmo_core.text._token_hash is not built")
    ids, line_offsets, entry_offsets, entry_bytes = split_and_encode(block)
    dictionary = strings_from_buffers(entry_offsets, entry_bytes)
    indices = pa.Array.from_buffers(pa.int32(), len(ids) // 4, [None, pa.py_buffer(ids)])
    tokens = pa.DictionaryArray.from_arrays(indices, dictionary)
    return BlockTokens(tokens, np.frombuffer(line_offsets, dtype=np.int64))


def split_block_numpy(block: bytes) -> BlockTokens:
    """The NumPy pass over a block already known to be UTF-8."""
    data = np.frombuffer(block, dtype=np.uint8)
    space = (data <= 32) & ((data == 32) | ((data >= 9) & (data <= 13)) | (data >= 28))
    if len(data) and data.max() >= 0xC2:
        _mark_wide_spaces(data, space)
    step = np.diff(space.view(np.int8), prepend=np.int8(1), append=np.int8(1))
    starts, ends = np.flatnonzero(step == -1), np.flatnonzero(step == 1)
    offsets = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(ends - starts, out=offsets[1:])
    tokens = pa.StringArray.from_buffers(
        len(starts), pa.py_buffer(offsets), pa.py_buffer(np.compress(~space, data))
    )
    line_ends = np.flatnonzero(data == 10)
    if not block.endswith(b"\n"):
        line_ends = np.append(line_ends, len(data))
    line_offsets = np.zeros(len(line_ends) + 1, dtype=np.int64)
    line_offsets[1:] = np.searchsorted(starts, line_ends)
    return BlockTokens(tokens, line_offsets)


def _mark_wide_spaces(data: np.ndarray, space: np.ndarray) -> None:
    """Mark the bytes of every multi-byte Unicode space in ``data`` as separators (in place)."""
    leads = np.flatnonzero((data == 0xC2) | ((data >= 0xE1) & (data <= 0xE3)))
    if not len(leads):
        return
    last = len(data) - 1
    for sequence in _WIDE_SPACES:
        hit = leads[data[leads] == sequence[0]]
        for offset in range(1, len(sequence)):
            hit = hit[data[np.minimum(hit + offset, last)] == sequence[offset]]
        for offset in range(len(sequence)):
            space[hit + offset] = True
