"""The Parquet shard format of prepared datasets (``elmo-shards``), and its kernels.

A sentence is stored as its word-type ids without ``<S>``/``</S>``. Type ids 0..V-1 are the
vocabulary, then OOV types by descending count, so targets are derived (:func:`target_ids`), not
stored, and the char CNN reads every type (docs/architecture.md, "Vocabulary").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elmo_core.config import PrepareConfig
from elmo_core.errors import DataError
from elmo_core.location import atomic_write, sha256_file
from elmo_core.text.char_ids import (
    BOS_IDS,
    BOS_TOKEN,
    BOW_CHAR,
    EOS_IDS,
    EOS_TOKEN,
    EOW_CHAR,
    ID_OFFSET,
    MAX_CHARS_PER_TOKEN,
    MAX_TOKEN_BYTES,
    PAD_CHAR,
)
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.vocab import UNK_ID

SHARD_FORMAT = "elmo-shards"
SHARD_FORMAT_VERSION = 3
CHUNK_BYTES = 16 << 20  # text read per block: amortises the per-block Arrow kernel overheads

ID_LIST_COLUMNS = ("types",)
ID_LIST_TYPE = pa.list_(pa.field("element", pa.int32(), nullable=False))
TRAIN_SCHEMA = pa.schema([pa.field("types", ID_LIST_TYPE, nullable=False)])
HELDOUT_SCHEMA = TRAIN_SCHEMA.append(
    pa.field("source_file", pa.dictionary(pa.int32(), pa.string()), nullable=False)
).append(pa.field("line", pa.int64(), nullable=False))
CHAR_IDS_TYPE = pa.binary(2 * MAX_CHARS_PER_TOKEN)  # 50 little-endian int16 per token
WORD_TYPES_SCHEMA = pa.schema(
    [
        ("type_id", pa.int32()),
        ("token", pa.string()),
        ("count", pa.int64()),
        ("heldout_count", pa.int64()),
        ("vocab_id", pa.int32()),
        ("char_ids", CHAR_IDS_TYPE),
    ]
)
TYPE_ORDER_SCHEMA = WORD_TYPES_SCHEMA.remove(WORD_TYPES_SCHEMA.get_field_index("char_ids"))


@dataclass
class FileStats:
    """What reading one input file skipped or repaired; summed into the manifest."""

    lines: int = 0
    blank_lines: int = 0
    invalid_utf8_replacements: int = 0
    long_lines_split: int = 0
    long_lines_dropped: int = 0

    def add(self, other: FileStats) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))


@dataclass(frozen=True)
class SentenceChunk:
    """A block of sentences of one file: tokens, the 1-based line and index of each sentence."""

    sentences: pa.ListArray  # list<string> or list<dictionary<int32, string>>, never empty lists
    lines: np.ndarray  # (n,) int64
    index: np.ndarray  # (n,) int64, sentence index within the file, stable across passes


def read_sentences(
    path: Path, tokenizer: Tokenizer, cfg: PrepareConfig, stats: FileStats
) -> Iterator[SentenceChunk]:
    """Stream a text file as blocks of tokenized sentences, counting what was skipped in ``stats``.

    Blank lines are skipped; invalid UTF-8 is replaced (counted) or a :class:`DataError` naming
    file and line, by ``cfg.on_invalid_utf8``; sentences over ``cfg.max_tokens_per_line`` tokens
    are split into pieces or dropped by ``cfg.on_long_line``. A missing file, or one without a
    single sentence, is a :class:`DataError`.
    """
    if not path.is_file():
        raise DataError("input file not found", path=path)
    next_line, next_index = 1, 0
    for block in _line_blocks(path):
        lines = _decode_lines(block, path, next_line, cfg.on_invalid_utf8, stats)
        sentences, origin = tokenizer.tokenize_lines(lines)
        stats.lines += len(lines)
        stats.blank_lines += len(lines) - _num_distinct(origin)
        sentences, line_of = _limit_length(sentences, origin + next_line, cfg, stats)
        next_line += len(lines)
        if len(sentences):
            index = np.arange(next_index, next_index + len(sentences), dtype=np.int64)
            yield SentenceChunk(sentences, line_of, index)
            next_index += len(sentences)
    if next_index == 0:
        raise DataError("input file is empty (no non-blank line)", path=path)


def _num_distinct(ascending: np.ndarray) -> int:
    """How many distinct values an ascending array holds (lines that gave a sentence)."""
    return int(np.count_nonzero(np.diff(ascending))) + 1 if len(ascending) else 0


def _line_blocks(path: Path, block_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Blocks of whole lines (each ends with ``\\n`` except maybe the file's last)."""
    carry = b""
    with open(path, "rb") as handle:
        while data := handle.read(block_bytes):
            data = carry + data
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                yield data[:cut]
    if carry:
        yield carry


def _decode_lines(
    block: bytes, path: Path, first_line: int, on_invalid: str, stats: FileStats
) -> pa.StringArray:
    offsets = pa.py_buffer(np.array([0, len(block)], dtype=np.int32))
    whole = pa.BinaryArray.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(block)])
    try:
        text = whole.cast(pa.string())  # Arrow's UTF-8 check, no copy
    except pa.ArrowInvalid:
        return _decode_lines_slowly(block, path, first_line, on_invalid, stats)
    lines = pc.split_pattern(text, "\n").values
    return lines[:-1] if block.endswith(b"\n") else lines


def _decode_lines_slowly(
    block: bytes, path: Path, first_line: int, on_invalid: str, stats: FileStats
) -> pa.StringArray:
    """The rare path: find the bad lines, then replace (and count) or fail naming the line."""
    raw_lines = block.split(b"\n")
    if block.endswith(b"\n"):
        raw_lines.pop()
    decoded = []
    for offset, raw in enumerate(raw_lines):
        try:
            decoded.append(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            if on_invalid == "fail":
                where = f"invalid UTF-8 byte 0x{raw[err.start]:02x} at column {err.start + 1}"
                raise DataError(where, path=path, line=first_line + offset) from None
            text = raw.decode("utf-8", errors="replace")
            stats.invalid_utf8_replacements += text.count("\ufffd") - raw.count(b"\xef\xbf\xbd")
            decoded.append(text)
    return pa.array(decoded, type=pa.string())


def flat_lists(lists: pa.ListArray) -> tuple[pa.Array, np.ndarray]:
    """(values, offsets from 0) of a possibly sliced list array."""
    offsets = lists.offsets.to_numpy()
    values = lists.values[offsets[0] : offsets[-1]]
    return values, (offsets - offsets[0]).astype(np.int64)


def _limit_length(
    sentences: pa.ListArray, line_of: np.ndarray, cfg: PrepareConfig, stats: FileStats
) -> tuple[pa.ListArray, np.ndarray]:
    limit = cfg.max_tokens_per_line
    lengths = pc.list_value_length(sentences).to_numpy(zero_copy_only=False)
    long = lengths > limit
    num_long = int(long.sum())
    if not num_long:
        return sentences, line_of
    if cfg.on_long_line == "drop":
        stats.long_lines_dropped += num_long
        keep = ~long
        if pa.types.is_dictionary(sentences.type.value_type):  # keep no unused entries
            sentences = sentences.cast(pa.list_(pa.string()))
        return sentences.filter(pa.array(keep)), line_of[keep]
    stats.long_lines_split += num_long
    values, offsets = flat_lists(sentences)
    pieces = np.maximum(1, -(-lengths // limit))  # ceil, at least one piece per sentence
    row = np.repeat(np.arange(len(lengths)), pieces)
    piece = np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    starts = offsets[:-1][row] + piece * limit
    new_offsets = np.append(starts, offsets[-1]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(new_offsets), values), line_of[row]


_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a fast, well-mixed 64-bit hash of each element."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def sentence_hash(seed: int, salt: int, file_index: int, index: np.ndarray) -> np.ndarray:
    """A seeded 64-bit hash of (file, sentence index): decisions independent of workers/blocks."""
    base = (seed * 0x9E3779B97F4A7C15 + salt * 0xD1B54A32D192ED03 + (file_index << 40)) & _MASK64
    return _mix64(index.astype(np.uint64) + np.uint64(base))


def heldout_mask(seed: int, file_index: int, index: np.ndarray, fraction: float) -> np.ndarray:
    """Which sentences a seeded ``fraction`` sends to heldout (text without heldout files)."""
    uniform = (sentence_hash(seed, 1, file_index, index) >> np.uint64(11)) * 2.0**-53
    return uniform < fraction


def train_shard_of(seed: int, file_index: int, index: np.ndarray, num_shards: int) -> np.ndarray:
    """The output training shard of each sentence: a seeded hash, so the shuffle streams."""
    return (sentence_hash(seed, 2, file_index, index) % np.uint64(num_shards)).astype(np.int32)


def shard_permutation(seed: int, shard: int, num_rows: int) -> np.ndarray:
    """The shuffled order of a training shard's rows, which arrive in (file, sentence) order.

    That arrival order does not depend on the workers or the blocks, so a permutation seeded
    by (seed, shard) shuffles the same way every run, and costs less than sorting by a key.
    """
    entropy = [seed & _MASK64, shard]  # PCG64 takes non-negative entropy; seeds may be negative
    return np.random.Generator(np.random.PCG64(entropy)).permutation(num_rows)


class TypeIndex:
    """Type ids of tokens: each block's dictionary of distinct tokens looked up in the type table.

    Arrow's ``index_in`` hashes the smaller side, the block's dictionary, and probes it with
    every type (a block holds far fewer distinct tokens than the corpus has types).
    """

    def __init__(self, type_tokens: pa.Array) -> None:
        self.type_tokens = type_tokens

    def type_ids(self, dictionary: pa.Array) -> np.ndarray:
        """``(D,)`` int32: the type id of each entry of a block's dictionary of distinct tokens."""
        position = pc.fill_null(pc.index_in(self.type_tokens, value_set=dictionary), -1)
        position = position.to_numpy()
        found = position >= 0
        ids = np.full(len(dictionary), -1, dtype=np.int32)
        ids[position[found]] = np.flatnonzero(found)
        if len(ids) and ids.min() < 0:
            raise DataError("a token is missing from the word-type table: did an input change?")
        return ids


def target_ids(types: np.ndarray, vocab_size: int) -> np.ndarray:
    """``(n,)`` int32 vocabulary ids of type ids: the vocabulary itself, else ``<UNK>``."""
    return np.where(types < vocab_size, types, np.int32(UNK_ID)).astype(np.int32)


def sentence_table(types: np.ndarray, offsets: np.ndarray) -> pa.Table:  # rows: sentences
    """A training-schema table from flat type ids and sentence offsets."""
    offsets32 = pa.array(offsets.astype(np.int32))
    types_list = pa.ListArray.from_arrays(
        offsets32, pa.array(types, type=pa.int32()), type=ID_LIST_TYPE
    )
    return pa.Table.from_arrays([types_list], schema=TRAIN_SCHEMA)


def char_id_rows(tokens: pa.Array) -> np.ndarray:
    """``(N, 50)`` int16 char ids of each token, vectorised over the UTF-8 bytes.

    Identical to :func:`elmo_core.text.char_ids.token_to_ids` per token (48-byte cut included).
    """
    binary = pc.cast(tokens, pa.large_binary())
    num = len(binary)
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[
        binary.offset : binary.offset + num + 1
    ]
    data = np.frombuffer(binary.buffers()[2], dtype=np.uint8) if num else np.zeros(0, np.uint8)
    lengths = np.minimum(np.diff(offsets), MAX_TOKEN_BYTES)
    out = np.full((num, MAX_CHARS_PER_TOKEN), PAD_CHAR + ID_OFFSET, dtype=np.int16)
    out[:, 0] = BOW_CHAR + ID_OFFSET
    out[np.arange(num), lengths + 1] = EOW_CHAR + ID_OFFSET
    rows = np.repeat(np.arange(num), lengths)
    position = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, position + 1] = data[offsets[:-1][rows] + position].astype(np.int16) + ID_OFFSET
    token_list = tokens
    for marker, ids in ((BOS_TOKEN, BOS_IDS), (EOS_TOKEN, EOS_IDS)):
        out[pc.equal(token_list, marker).to_numpy(zero_copy_only=False)] = ids
    return out


def char_ids_array(rows: np.ndarray) -> pa.FixedSizeBinaryArray:
    """``(N, 50)`` int16 ids as ``fixed_size_binary[100]`` (little-endian), one buffer."""
    data = np.ascontiguousarray(rows, dtype="<i2")
    buffers = [None, pa.py_buffer(data)]
    return pa.FixedSizeBinaryArray.from_buffers(CHAR_IDS_TYPE, len(data), buffers)


def char_ids_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The ``(N, 50)`` int16 ids of a ``char_ids`` column: :func:`char_ids_array` undone."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = CHAR_IDS_TYPE.byte_width
    data = np.frombuffer(array.buffers()[1] or b"", dtype=np.uint8)
    data = data[array.offset * width : (array.offset + len(array)) * width]
    return data.view("<i2").astype(np.int16, copy=False).reshape(-1, MAX_CHARS_PER_TOKEN)


def char_id_column(tokens: pa.Array, rows_per_chunk: int = 1 << 16) -> pa.ChunkedArray:
    """The char ids of every token, a chunk of tokens at a time.

    :func:`char_id_rows` makes several int64 temporaries per byte of text; chunking keeps them
    a few MB whatever the number of word types, so they never set the peak memory of prepare.
    """
    return pa.chunked_array(
        [
            char_ids_array(char_id_rows(tokens.slice(start, rows_per_chunk)))
            for start in range(0, len(tokens), rows_per_chunk)
        ],
        type=CHAR_IDS_TYPE,
    )


def write_parquet(table: pa.Table, path: Path, rows_per_group: int) -> str:
    """Write ``table`` to ``path`` atomically (temporary name, then rename); its sha256.

    Id lists are stored BYTE_STREAM_SPLIT + zstd: splitting the int32s into byte planes puts
    the (mostly zero) high bytes of frequent ids together, so zstd at level 1 compresses them
    smaller and faster than plain encoding
    (benchmarks/results/bench_prepare_session2-2026-11-21.md; BYTE_STREAM_SPLIT for INT32 is
    Parquet format 2.11: read by Arrow >= 16). Page statistics (min/max of ids) are not written:
    no reader prunes on them.
    """
    id_lists = [f"{name}.list.element" for name in ID_LIST_COLUMNS if name in table.column_names]

    def write(temporary: Path) -> str:
        pq.write_table(
            table,
            temporary,
            row_group_size=rows_per_group,
            compression="zstd",
            compression_level=1,
            use_dictionary=["source_file"] if "source_file" in table.column_names else False,
            column_encoding=dict.fromkeys(id_lists, "BYTE_STREAM_SPLIT") or None,
            data_page_version="2.0",
            write_statistics=False,
        )
        return sha256_file(temporary)

    return atomic_write(path, write)
