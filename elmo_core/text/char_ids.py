"""The character-id scheme of the original ELMo, in the inference convention
(docs/architecture.md, "Character ids").

A token's UTF-8 bytes, cut to 48 (maybe inside a character, as the original does), become
``[bow, b1..bn, eow]`` padded to 50, each id +1 so that 0 means "no token" (AllenNLP's
``batch_to_ids``). bilm-tf's 261-row table is handled only in :mod:`elmo_core.interop.bilm_tf`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from elmo_core.errors import DataError

if TYPE_CHECKING:  # torch is imported where a tensor is made, so data tools stay light
    import torch

MAX_CHARS_PER_TOKEN = 50
MAX_TOKEN_BYTES = MAX_CHARS_PER_TOKEN - 2
NUM_CHARACTERS = 262  # 256 bytes + 5 specials, +1 for the padding row

# Raw ids of the original (261-row) table; add ID_OFFSET for the inference convention.
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
ID_OFFSET = 1

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"


def _marker_ids(marker: int) -> np.ndarray:
    ids = np.full(MAX_CHARS_PER_TOKEN, PAD_CHAR + ID_OFFSET, dtype=np.int16)
    ids[:3] = [BOW_CHAR + ID_OFFSET, marker + ID_OFFSET, EOW_CHAR + ID_OFFSET]
    return ids


BOS_IDS = _marker_ids(BOS_CHAR)  # (W,) the <S> marker the biLM prepends
EOS_IDS = _marker_ids(EOS_CHAR)  # (W,) the </S> marker the biLM appends


def token_byte_length_exceeds(token: str) -> bool:
    """True when the token is cut by the scheme (counted by prepare, never an error)."""
    return len(token.encode("utf-8")) > MAX_TOKEN_BYTES


@lru_cache(maxsize=1 << 16)
def _cached_token_ids(token: str) -> bytes:
    return token_to_ids(token).tobytes()


def token_to_ids(token: str) -> np.ndarray:
    """``(50,)`` int16 ids of one token in the +1 convention; the specials map to their markers."""
    if token == BOS_TOKEN:
        return BOS_IDS.copy()
    if token == EOS_TOKEN:
        return EOS_IDS.copy()
    if not token:
        raise DataError("an empty string is not a token")
    encoded = token.encode("utf-8")[:MAX_TOKEN_BYTES]
    ids = np.full(MAX_CHARS_PER_TOKEN, PAD_CHAR + ID_OFFSET, dtype=np.int16)
    ids[0] = BOW_CHAR + ID_OFFSET
    ids[1 : len(encoded) + 1] = np.frombuffer(encoded, dtype=np.uint8).astype(np.int16) + ID_OFFSET
    ids[len(encoded) + 1] = EOW_CHAR + ID_OFFSET
    return ids


def tokens_to_ids(tokens: Sequence[str]) -> np.ndarray:
    """``(N, 50)`` int16 ids for a list of tokens (a word-type table, or one sentence)."""
    out = np.empty((len(tokens), MAX_CHARS_PER_TOKEN), dtype=np.int16)
    for row, token in enumerate(tokens):
        out[row] = np.frombuffer(_cached_token_ids(token), dtype=np.int16)
    return out


def batch_to_ids(sentences: list[list[str]]) -> torch.Tensor:
    """``(B, T, 50)`` long ids of tokenized sentences, 0-padded to the longest; no sentence markers.

    Rows of empty sentences are all padding. The biLM adds ``<S>``/``</S>`` itself.
    """
    import torch

    if not isinstance(sentences, list | tuple):
        raise DataError("batch_to_ids expects a list of token lists")
    longest = max((len(sentence) for sentence in sentences), default=0)
    out = np.zeros((len(sentences), longest, MAX_CHARS_PER_TOKEN), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            raise DataError(f"sentence {row} is a string; pass a list of tokens")
        if sentence:
            out[row, : len(sentence)] = tokens_to_ids(sentence)
    return torch.from_numpy(out)
