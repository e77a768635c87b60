import numpy as np
import pytest
import torch

from elmo_core.errors import DataError
from elmo_core.text.char_ids import (
    BOS_IDS,
    EOS_IDS,
    MAX_CHARS_PER_TOKEN,
    batch_to_ids,
    token_byte_length_exceeds,
    token_to_ids,
    tokens_to_ids,
)

PAD = 261  # 260 + 1
BOW = 259
EOW = 260


def test_ascii_token_is_wrapped_and_shifted_by_one():
    ids = token_to_ids("ab")
    assert ids.shape == (MAX_CHARS_PER_TOKEN,)
    assert list(ids[:4]) == [BOW, ord("a") + 1, ord("b") + 1, EOW]
    assert (ids[4:] == PAD).all()


def test_multibyte_characters_use_their_utf8_bytes():
    cafe = token_to_ids("café")
    assert list(cafe[1:6]) == [b + 1 for b in "café".encode()]
    assert cafe[6] == EOW
    tokyo = token_to_ids("東京")
    assert list(tokyo[1:7]) == [b + 1 for b in "東京".encode()]
    assert tokyo[7] == EOW


def test_long_token_is_cut_at_48_bytes_even_inside_a_character():
    token = "a" + "é" * 30  # 61 bytes; byte 48 falls inside an "é"
    assert token_byte_length_exceeds(token)
    ids = token_to_ids(token)
    kept = token.encode()[:48]
    assert list(ids[1:49]) == [b + 1 for b in kept]
    assert ids[49] == EOW
    assert not token_byte_length_exceeds("é" * 24)


def test_sentence_markers():
    assert list(BOS_IDS[:4]) == [BOW, 257, EOW, PAD]
    assert list(EOS_IDS[:4]) == [BOW, 258, EOW, PAD]
    np.testing.assert_array_equal(token_to_ids("<S>"), BOS_IDS)
    np.testing.assert_array_equal(token_to_ids("</S>"), EOS_IDS)


def test_tokens_to_ids_matches_token_to_ids():
    tokens = ["The", "cat", "café", "The"]
    table = tokens_to_ids(tokens)
    for row, token in enumerate(tokens):
        np.testing.assert_array_equal(table[row], token_to_ids(token))


def test_batch_to_ids_pads_with_zero_rows():
    ids = batch_to_ids([["a", "b", "c"], ["d"], []])
    assert ids.shape == (3, 3, 50)
    assert ids.dtype == torch.long
    assert ids[1, 1:].abs().sum() == 0
    assert ids[2].abs().sum() == 0
    assert ids[1, 0, 1] == ord("d") + 1


def test_bad_inputs_are_clear_errors():
    with pytest.raises(DataError, match="empty string"):
        token_to_ids("")
    with pytest.raises(DataError, match="list of tokens"):
        batch_to_ids(["not a token list"])
