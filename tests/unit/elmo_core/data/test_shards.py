import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.shards import (
    FileStats,
    TypeIndex,
    char_id_column,
    char_id_rows,
    char_ids_matrix,
    heldout_mask,
    read_sentences,
    shard_permutation,
    train_shard_of,
)
from elmo_core.errors import DataError
from elmo_core.text.char_ids import token_to_ids
from elmo_core.text.tokenize import WhitespaceTokenizer


def _read(path, **options):
    stats = FileStats()
    chunks = list(read_sentences(path, WhitespaceTokenizer(), PrepareConfig(**options), stats))
    sentences = [s for chunk in chunks for s in chunk.sentences.to_pylist()]
    lines = [n for chunk in chunks for n in chunk.lines.tolist()]
    return sentences, lines, stats


def test_char_id_rows_match_the_per_token_scheme():
    tokens = ["a", "<S>", "</S>", "<UNK>", "é" * 30, "x" * 60, "日本語"]
    expected = np.stack([token_to_ids(token) for token in tokens])
    np.testing.assert_array_equal(char_id_rows(pa.array(tokens)), expected)


def test_reading_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a b\n\n   \nc  d e\nlast")
    sentences, lines, stats = _read(path)
    assert sentences == [["a", "b"], ["c", "d", "e"], ["last"]]
    assert lines == [1, 4, 5]
    assert (stats.lines, stats.blank_lines) == (5, 2)


def test_invalid_utf8_is_replaced_and_counted_or_fails_naming_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes("ok \ufffd\n".encode() + b"fine\nx \xff\xfe y\n")
    sentences, _, stats = _read(path)
    assert sentences[2] == ["x", "\ufffd\ufffd", "y"]
    assert stats.invalid_utf8_replacements == 2  # the valid U+FFFD on line 1 is not counted
    with pytest.raises(DataError, match=r"bad.txt:3: invalid UTF-8 byte 0xff at column 3"):
        _read(path, on_invalid_utf8="fail")


def test_long_lines_are_split_or_dropped_and_counted(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("a b c d e f g\nshort\n", encoding="utf-8")
    sentences, lines, stats = _read(path, max_tokens_per_line=3)
    assert sentences == [["a", "b", "c"], ["d", "e", "f"], ["g"], ["short"]]
    assert lines == [1, 1, 1, 2] and stats.long_lines_split == 1
    sentences, _, stats = _read(path, max_tokens_per_line=3, on_long_line="drop")
    assert sentences == [["short"]] and stats.long_lines_dropped == 1


@pytest.mark.parametrize("content", [b"", b"\n  \n\n"])
def test_empty_or_blank_input_is_a_data_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match="empty.txt: input file is empty"):
        _read(path)


def test_missing_input_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="nowhere.txt: input file not found"):
        _read(tmp_path / "nowhere.txt")


def test_type_index_finds_each_dictionary_entry_and_refuses_unknown_tokens():
    words = ["<S>", "</S>", "<UNK>", "the", "cat", "zyzzyva", "東京", "x" * 60]
    words += [f"type-{i}" for i in range(5000)]
    index = TypeIndex(pa.array(["unused", *words])[1:])  # a slice: offsets not from 0
    dictionary = pa.array(["", "東京", "cat", "x" * 60, "type-4999", "zyzzyva"])[1:]
    assert index.type_ids(dictionary).tolist() == [6, 4, 7, 5007, 5]
    with pytest.raises(DataError, match="missing from the word-type table"):
        index.type_ids(pa.array(["cat", "dog"]))


def test_seeded_hash_decisions_are_reproducible_and_roughly_uniform():
    index = np.arange(20_000)
    mask = heldout_mask(7, 3, index, 0.1)
    assert np.array_equal(mask, heldout_mask(7, 3, index, 0.1))
    assert 0.08 < mask.mean() < 0.12
    assert not np.array_equal(mask, heldout_mask(8, 3, index, 0.1))
    shards = train_shard_of(7, 3, index, 4)
    assert np.bincount(shards, minlength=4).min() > 4_500


def test_shard_permutations_are_seeded_by_seed_and_shard():
    order = shard_permutation(7, 3, 1000)
    assert np.array_equal(np.sort(order), np.arange(1000))
    assert np.array_equal(order, shard_permutation(7, 3, 1000))
    assert not np.array_equal(order, shard_permutation(7, 4, 1000))
    assert not np.array_equal(order, shard_permutation(8, 3, 1000))
    assert not np.array_equal(shard_permutation(-1, 3, 1000), shard_permutation(1, 3, 1000))


def test_char_ids_column_round_trips_through_parquet(tmp_path):
    """fixed_size_binary[100], little-endian int16: written and read back unchanged."""
    tokens = pa.array(["a", "é" * 30, "x" * 60, "東京", "<S>"])
    table = pa.table({"char_ids": char_id_column(tokens, rows_per_chunk=2)})
    pq.write_table(table, tmp_path / "t.parquet")
    back = pq.read_table(tmp_path / "t.parquet")["char_ids"]
    assert back.type == pa.binary(100)
    np.testing.assert_array_equal(char_ids_matrix(back), char_id_rows(tokens))
    np.testing.assert_array_equal(
        char_ids_matrix(back.combine_chunks().slice(3)), char_id_rows(tokens)[3:]
    )


def test_any_invalid_utf8_fails_naming_its_line_and_valid_text_never(tmp_path):
    """Pieces of characters (split around spaces too), which only the whole block may reveal."""
    pieces = [b"a", b" ", b"\n", b"\xc2\xa0", b"\xe2\x80", b"\xa6", b"\xc2", b"\x85"]
    pieces += [b"\xe3\x80\x80", b"\xf0\x9f\x98", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xff"]
    pieces += ["é東".encode()]
    rng = random.Random(1)
    path = tmp_path / "piece.txt"
    for _ in range(300):
        block = b"x\n" + b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        path.write_bytes(block)
        try:
            expected = [line.split() for line in block.decode("utf-8").split("\n")]
        except UnicodeDecodeError as err:
            line = block[: err.start].count(b"\n") + 1
            with pytest.raises(DataError, match=f"piece.txt:{line}: invalid UTF-8"):
                _read(path, on_invalid_utf8="fail")
            continue
        assert _read(path, on_invalid_utf8="fail")[0] == [s for s in expected if s], block
