"""Raw text → sentences of tokens, the same way at prepare time and at inference time.

Two tokenizers, chosen by the corpus format and recorded in the dataset manifest by name and
parameters (:meth:`Tokenizer.describe`), so that inference rebuilds the exact same one
(:meth:`Tokenizer.from_manifest`) and tokenizes raw sentences as the training data was:

- ``whitespace`` for the 1B Word Benchmark, which is already tokenized: one sentence per line,
  split on (Unicode) whitespace only, case kept (the original bilm-tf reads it with
  ``line.split()``).
- ``moses`` for any other text: sentence splitting on end punctuation (Moses' English nonbreaking
  prefixes keep "Mr." and "U.S." intact), then Moses tokenization by sacremoses, case kept.

Both have a vectorised entry point, :meth:`Tokenizer.tokenize_lines`, used by prepare on blocks
of lines held as Arrow arrays; the whitespace one never loops over tokens in Python, and also
splits raw UTF-8 blocks directly (:meth:`Tokenizer.tokenize_block`,
:mod:`elmo_core.text.whitespace_block`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elmo_core.errors import DataError
from elmo_core.text.whitespace_block import BlockTokens, split_whitespace_block

# The characters Python's str.split() treats as whitespace beyond " \t\n\v\f\r", in RE2 syntax:
# Arrow's RE2 scans a block ~5x faster than Python's re did on its UTF-8 bytes.
_NON_ASCII_SPACE = (
    r"[\x1c-\x1f\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)


def split_whitespace(lines: pa.Array) -> pa.ListArray:
    """``list<string>`` of each line's whitespace-separated tokens (empty list for a blank line).

    Arrow's ``utf8_split_whitespace`` keeps empty strings between repeated separators (like
    ``str.split(" ")``); they are removed here so the result equals Python's ``line.split()``.
    """
    unicode_space = bool(pc.any(pc.match_substring_regex(lines, _NON_ASCII_SPACE)).as_py())
    # The ASCII kernel is ~2.5x faster; it is exact unless the block holds other Unicode spaces.
    split = pc.utf8_split_whitespace(lines) if unicode_space else pc.ascii_split_whitespace(lines)
    flat = pc.list_flatten(split)
    parents = pc.list_parent_indices(split)
    keep = pc.greater(pc.binary_length(flat), 0)
    flat = pc.filter(flat, keep)
    parents = pc.filter(parents, keep).to_numpy(zero_copy_only=False)
    lengths = np.bincount(parents, minlength=len(lines))
    offsets = np.zeros(len(lines) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


class Tokenizer(ABC):
    """Turns text into sentences of tokens; identified in manifests by :meth:`describe`."""

    name: ClassVar[str]

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Name and parameters, enough for :meth:`from_manifest` to rebuild this tokenizer."""

    @abstractmethod
    def tokenize(self, text: str) -> list[list[str]]:
        """One raw text (a line, a paragraph) → its sentences, each a list of tokens."""

    def tokenize_lines(self, lines: pa.Array) -> tuple[pa.ListArray, np.ndarray]:
        """Non-blank lines → (``list<string>`` sentences, index of the line each came from).

        The default loops over lines in Python; subclasses override it with Arrow kernels.
        """
        sentences: list[list[str]] = []
        origin: list[int] = []
        for row, line in enumerate(lines.to_pylist()):
            for sentence in self.tokenize(line or ""):
                if sentence:
                    sentences.append(sentence)
                    origin.append(row)
        return pa.array(sentences, type=pa.list_(pa.string())), np.asarray(origin, dtype=np.int64)

    def tokenize_block(self, block: bytes) -> BlockTokens | None:
        """A raw block of whole lines → one sentence per line, without decoding lines first.

        None when this tokenizer has no such path (sentences may span or split lines) or the
        block is not valid UTF-8: the caller then decodes and calls :meth:`tokenize_lines`.
        """
        return None

    @staticmethod
    def from_manifest(description: Mapping[str, Any]) -> Tokenizer:
        """The tokenizer a dataset was prepared with, from its manifest's ``tokenizer`` entry."""
        params = dict(description)
        name = params.pop("name", None)
        params.pop("version", None)
        if name == WhitespaceTokenizer.name:
            return WhitespaceTokenizer()
        if name == MosesTokenizer.name:
            return MosesTokenizer(**params)
        raise DataError(f"unknown tokenizer {name!r} in manifest")

    @staticmethod
    def for_format(corpus_format: str) -> Tokenizer:
        """``whitespace`` for ``1b-benchmark`` (already tokenized), ``moses`` for ``text``."""
        return WhitespaceTokenizer() if corpus_format == "1b-benchmark" else MosesTokenizer()


class WhitespaceTokenizer(Tokenizer):
    """Already tokenized text: one sentence per line, split on whitespace, case kept."""

    name = "whitespace"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "sentence_per_line": True, "lowercase": False}

    def tokenize(self, text: str) -> list[list[str]]:
        return [tokens] if (tokens := text.split()) else []

    def tokenize_lines(self, lines: pa.Array) -> tuple[pa.ListArray, np.ndarray]:
        return split_whitespace(lines), np.arange(len(lines), dtype=np.int64)

    def tokenize_block(self, block: bytes) -> BlockTokens | None:
        return split_whitespace_block(block)


# End punctuation, optional closing quotes/brackets, whitespace, then a likely sentence start.
_BOUNDARY = re.compile(r"""([.?!]+["'”’)\]]*)\s+(?=["'“‘(\[]*[A-Z0-9À-ÖØ-Þ])""")
_LAST_WORD = re.compile(r"(\S+)$")


class MosesTokenizer(Tokenizer):
    """Moses-style sentence splitting and tokenization (sacremoses), case kept.

    Sentence splitting follows Moses' ``split-sentences.perl`` in spirit: a boundary is end
    punctuation followed by whitespace and an upper-case letter, digit or opening quote, unless
    the word before is a nonbreaking prefix of the language ("Mr.", "Dr.", single letters).
    """

    name = "moses"

    def __init__(
        self, lang: str = "en", escape: bool = False, aggressive_dash_splits: bool = False
    ) -> None:
        self.lang = lang
        self.escape = escape
        self.aggressive_dash_splits = aggressive_dash_splits

    def describe(self) -> dict[str, Any]:
        import sacremoses

        return {
            "name": self.name,
            "lang": self.lang,
            "escape": self.escape,
            "aggressive_dash_splits": self.aggressive_dash_splits,
            "version": sacremoses.__version__,
        }

    @cached_property
    def _moses(self) -> Any:
        from sacremoses import MosesTokenizer as _Moses

        return _Moses(lang=self.lang)

    @cached_property
    def _nonbreaking(self) -> frozenset[str]:
        from sacremoses import NonbreakingPrefixes

        return frozenset(NonbreakingPrefixes().words(lang=self.lang))

    def split_sentences(self, text: str) -> list[str]:
        """Split one paragraph into sentences (strings), keeping abbreviations intact."""
        sentences: list[str] = []
        start = 0
        for match in _BOUNDARY.finditer(text):
            before = text[start : match.start(1)]
            word = _LAST_WORD.search(before)
            if match.group(1) == "." and word is not None:
                stem = word.group(1).lstrip("\"'“‘([")
                if stem in self._nonbreaking or (len(stem) == 1 and stem.isalpha()):
                    continue
            sentences.append(text[start : match.end(1)].strip())
            start = match.end()
        sentences.append(text[start:].strip())
        return [sentence for sentence in sentences if sentence]

    def tokenize(self, text: str) -> list[list[str]]:
        return [
            self._moses.tokenize(
                sentence, escape=self.escape, aggressive_dash_splits=self.aggressive_dash_splits
            )
            for sentence in self.split_sentences(text)
        ]
