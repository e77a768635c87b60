import numpy as np
import pyarrow as pa
import pytest

from elmo_core.errors import DataError
from elmo_core.text.vocab import (
    SPECIALS,
    UNK_ID,
    build_vocab,
    read_vocab,
    read_vocab_counts,
    vocab_counts_text,
    vocab_text,
)


def _build(counts: dict[str, int], **options):
    return build_vocab(pa.array(list(counts)), pa.array(list(counts.values())), **options)


def test_specials_first_then_descending_count_with_ties_by_utf8_bytes():
    vocab = _build({"b": 3, "a": 3, "é": 3, "Z": 3, "top": 9, "rare": 1})
    # Ties (count 3) in byte order: "Z" (0x5a) < "a" < "b" < "é" (0xc3 0xa9).
    assert vocab.tokens == [*SPECIALS, "top", "Z", "a", "b", "é", "rare"]
    assert vocab.counts.tolist() == [0, 0, 0, 9, 3, 3, 3, 3, 1]


def test_max_vocab_counts_the_specials_and_min_count_drops_rare_types():
    assert _build({"a": 5, "b": 4, "c": 3}, max_vocab=5).tokens == [*SPECIALS, "a", "b"]
    assert _build({"a": 5, "b": 1, "c": 2}, min_count=2).tokens == [*SPECIALS, "a", "c"]


@pytest.mark.parametrize("max_vocab", [3, 4, 5, 9, 12, 40, 60])
def test_a_cut_through_ties_keeps_the_prefix_of_the_full_order(max_vocab):
    rng = np.random.default_rng(max_vocab)
    counts = {f"w{i:02d}": int(rng.integers(1, 5)) for i in range(50)}
    full = _build(counts)
    cut = _build(counts, max_vocab=max_vocab)
    assert cut.tokens == full.tokens[:max_vocab]
    assert cut.counts.tolist() == full.counts[:max_vocab].tolist()


def test_a_literal_special_in_the_corpus_is_not_repeated():
    assert _build({"<UNK>": 7, "a": 1}).tokens == [*SPECIALS, "a"]


def test_import_finds_specials_anywhere_and_skips_maxtermid(tmp_path):
    path = tmp_path / "vocab-2016-09-10.txt"
    path.write_text("the\n,\n<S>\n!!!MAXTERMID\n.\n</S>\nof\n<UNK>\n", encoding="utf-8")
    vocab = read_vocab(str(path))
    assert vocab.tokens == [*SPECIALS, "the", ",", ".", "of"]
    assert vocab.ids(["of", "nope", "the"]).tolist() == [6, UNK_ID, 3]


def test_import_without_the_specials_is_a_data_error(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<S>\nthe\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"vocab.txt: .*lacks the special tokens </S>, <UNK>"):
        read_vocab(str(path))


def test_import_rejects_a_repeated_token_naming_the_line(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("<S>\n</S>\n<UNK>\nthe\nthe\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"vocab.txt:5: token 'the' repeats line 4"):
        read_vocab(str(path))


def test_written_files_round_trip_with_counts(tmp_path):
    vocab = _build({"a": 5, "b": 2})
    (tmp_path / "vocab.txt").write_text(vocab_text(vocab), encoding="utf-8")
    (tmp_path / "counts.tsv").write_text(vocab_counts_text(vocab), encoding="utf-8")
    assert (tmp_path / "vocab.txt").read_text().splitlines() == [*SPECIALS, "a", "b"]
    loaded = read_vocab_counts(
        str(tmp_path / "counts.tsv"), read_vocab(str(tmp_path / "vocab.txt"))
    )
    assert loaded.tokens == vocab.tokens
    np.testing.assert_array_equal(loaded.counts, vocab.counts)
