"""The target vocabulary: bilm-tf's ``vocab.txt``, built from training counts or imported.

``<S>``, ``</S>``, ``<UNK>`` first, then tokens by descending count: the sampled softmax's
log-uniform sampler assumes id order = frequency order (docs/architecture.md, "Vocabulary").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elmo_core.errors import DataError
from elmo_core.location import open_url
from elmo_core.text.char_ids import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN

SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
BOS_ID, EOS_ID, UNK_ID = 0, 1, 2
MAX_TERM_ID_LINE = "!!!MAXTERMID"


@dataclass(frozen=True)
class Vocabulary:
    """Tokens in id order (specials first) and their training counts (0 where unseen)."""

    tokens: list[str]
    counts: np.ndarray = field(repr=False)  # (V,) int64

    def __post_init__(self) -> None:
        if tuple(self.tokens[:3]) != SPECIALS:
            raise DataError(f"a vocabulary starts with {', '.join(SPECIALS)}")
        if len(self.counts) != len(self.tokens):
            raise ValueError("one count per token")

    def __len__(self) -> int:
        return len(self.tokens)

    def as_arrow(self) -> pa.Array:
        """The tokens as an Arrow string array (id = position), for vectorised lookups."""
        return pa.array(self.tokens, type=pa.string())

    def ids(self, tokens: Sequence[str]) -> np.ndarray:
        """Target ids of tokens (``<UNK>`` for out-of-vocabulary ones), vectorised."""
        found = pc.index_in(pa.array(list(tokens), type=pa.string()), value_set=self.as_arrow())
        return pc.fill_null(found, UNK_ID).to_numpy().astype(np.int32)


def build_vocab(
    tokens: pa.Array, counts: pa.Array, *, max_vocab: int | None = None, min_count: int = 1
) -> Vocabulary:
    """Vocabulary of the training types: descending count, ties by UTF-8 bytes, specials first.

    ``max_vocab`` bounds the whole size (specials included); ``min_count`` drops rarer types.
    A literal ``<S>``/``</S>``/``<UNK>`` in the corpus is not repeated after the specials.
    """
    table = pa.table({"token": tokens, "count": pc.cast(counts, pa.int64())})
    count = table["count"].to_numpy()
    keep = (count >= min_count) & ~pc.is_in(table["token"], pa.array(SPECIALS)).to_numpy()
    if max_vocab is not None:
        keep &= _most_frequent(count, keep, max(0, max_vocab - len(SPECIALS)))
    table = table.filter(pa.array(keep))
    # Arrow sorts strings by their bytes, which is the UTF-8 order we want for ties.
    order = pc.sort_indices(table, sort_keys=[("count", "descending"), ("token", "ascending")])
    if max_vocab is not None:
        order = order[: max(0, max_vocab - len(SPECIALS))]
    table = table.take(order)
    return Vocabulary(
        tokens=[*SPECIALS, *table["token"].to_pylist()],
        counts=np.concatenate([np.zeros(3, np.int64), table["count"].to_numpy()]),
    )


def _most_frequent(count: np.ndarray, keep: np.ndarray, num: int) -> np.ndarray:
    """Which rows are counted at least as often as the ``num``-th most frequent kept one.

    They are the first rows of the sorted order whatever the ties, so sorting only them gives
    the same vocabulary; sorting strings is the expensive part (a corpus has several times more
    types than a vocabulary keeps).
    """
    kept = count[keep]
    if num >= len(kept):
        return np.ones(len(count), dtype=bool)
    threshold = np.partition(kept, len(kept) - num)[len(kept) - num] if num else np.inf
    return count >= threshold


def read_vocab(url: str) -> Vocabulary:
    """Import a bilm-tf vocabulary file (local path or fsspec URL); counts are left at 0.

    The specials are found by name wherever they stand and put first; a ``!!!MAXTERMID`` line
    is skipped. A file without all three specials, or with a token twice, is a :class:`DataError`.
    """
    try:
        with open_url(url) as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise DataError("vocabulary file not found", path=url) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError("vocabulary is not UTF-8", path=url, line=line) from None
    tokens: list[str] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token or token == MAX_TERM_ID_LINE or token in SPECIALS:
            seen.setdefault(token, number)
            continue
        if token in seen:
            raise DataError(f"token {token!r} repeats line {seen[token]}", path=url, line=number)
        seen[token] = number
        tokens.append(token)
    missing = [special for special in SPECIALS if special not in seen]
    if missing:
        raise DataError(f"vocabulary lacks the special tokens {', '.join(missing)}", path=url)
    return Vocabulary(tokens=[*SPECIALS, *tokens], counts=np.zeros(len(tokens) + 3, np.int64))


def with_counts(vocab: Vocabulary, tokens: pa.Array, counts: pa.Array) -> Vocabulary:
    """The same vocabulary with counts looked up from (token, count) columns (0 where absent)."""
    position = pc.index_in(vocab.as_arrow(), value_set=tokens)
    found = pc.take(pc.cast(counts, pa.int64()), position)
    return Vocabulary(tokens=vocab.tokens, counts=pc.fill_null(found, 0).to_numpy())


def vocab_text(vocab: Vocabulary) -> str:
    """``vocab.txt`` contents: one token per line in id order."""
    return "\n".join(vocab.tokens) + "\n"


def vocab_counts_text(vocab: Vocabulary) -> str:
    """``vocab_counts.tsv`` contents: ``token<TAB>count`` per line in id order."""
    return "".join(f"{t}\t{c}\n" for t, c in zip(vocab.tokens, vocab.counts.tolist(), strict=True))


def read_vocab_counts(url: str, vocab: Vocabulary) -> Vocabulary:
    """``vocab`` with the counts of a ``vocab_counts.tsv`` (``token<TAB>count`` lines)."""
    with open_url(url, "rt", encoding="utf-8") as handle:
        pairs = [line.rstrip("\n").rsplit("\t", 1) for line in handle if line.strip()]
    tokens = pa.array([pair[0] for pair in pairs], type=pa.string())
    return with_counts(vocab, tokens, pa.array([int(pair[1]) for pair in pairs], pa.int64()))
