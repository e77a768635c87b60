"""Raw text → sentences of tokens, the same way at prepare time and at inference time.

The tokenizer is recorded in the manifest (:meth:`Tokenizer.describe`) so that inference rebuilds
the same one: ``whitespace`` for tokenized corpora (bilm-tf's ``line.split()``), ``moses`` for raw
text; both keep case.
"""

from __future__ import annotations

import itertools
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, ClassVar, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elmo_core.config import MosesLanguage
from elmo_core.errors import ConfigError, DataError

MIN_LINES_PER_THREAD = 1 << 14  # fewer lines are not worth a thread

# The characters Python's str.split() treats as whitespace beyond " \t\n\v\f\r", in RE2 syntax.
_NON_ASCII_SPACE = (
    r"[\x1c-\x1f\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)


def split_whitespace(lines: pa.Array, threads: int | None = None) -> pa.ListArray:
    """Each line's tokens as Python's ``line.split()`` (an empty list for a blank line), as
    ``list<dictionary<int32, string>>``: the tokens dictionary-encoded in first-occurrence order.

    Arrow's ASCII kernel splits faster than its Unicode one and is exact unless the lines
    hold another space (NBSP, U+3000, the separators 0x1c-0x1f, ...). Such a space stays inside
    a token there, so it is looked for in the distinct tokens only (a few percent of the bytes)
    and, where one is found, the lines are split again by the Unicode kernel. Both kernels give
    an empty string for leading and trailing whitespace; those are removed.

    Arrow's kernels release the GIL: ``threads`` (default: Arrow's CPU count, which prepare sets
    to a worker's share of the cores) split and encode that many slices of the lines at once,
    and their dictionaries are then merged in order, which gives the very same result.
    """
    threads = pa.cpu_count() if threads is None else threads
    num = min(threads, len(lines) // MIN_LINES_PER_THREAD)
    if num <= 1:
        return _split_slice(lines)
    bounds = [len(lines) * i // num for i in range(num + 1)]
    slices = [lines.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    with ThreadPoolExecutor(num) as pool:
        return concat_encoded(list(pool.map(_split_slice, slices)))


def _split_slice(lines: pa.Array) -> pa.ListArray:
    tokens = _split_encoded(pc.ascii_split_whitespace(lines))
    dictionary = tokens.values.dictionary
    if len(dictionary) and pc.any(pc.match_substring_regex(dictionary, _NON_ASCII_SPACE)).as_py():
        tokens = _split_encoded(pc.utf8_split_whitespace(lines))
    return tokens


def concat_encoded(pieces: list[pa.ListArray]) -> pa.ListArray:
    """``list<dictionary<int32, string>>`` arrays (offsets from 0) concatenated, their
    dictionaries merged in first-occurrence order: as if the whole had been encoded at once."""
    dictionary = pieces[0].values.dictionary
    ids = [pieces[0].values.indices.to_numpy()]
    offsets = [pieces[0].offsets.to_numpy()]
    for piece in pieces[1:]:
        entries = piece.values.dictionary
        found = pc.fill_null(pc.index_in(entries, value_set=dictionary), -1)
        mapping = found.to_numpy().astype(np.int32)  # a writable copy
        new = mapping < 0  # entries first seen in this piece, in their order
        mapping[new] = np.arange(len(dictionary), len(dictionary) + int(new.sum()), dtype=np.int32)
        dictionary = pa.concat_arrays([dictionary, entries.filter(pa.array(new))])
        ids.append(mapping[piece.values.indices.to_numpy()])
        offsets.append(piece.offsets.to_numpy()[1:] + offsets[-1][-1])
    tokens = pa.DictionaryArray.from_arrays(pa.array(np.concatenate(ids)), dictionary)
    return pa.ListArray.from_arrays(pa.array(np.concatenate(offsets)), tokens)


def _split_encoded(split: pa.ListArray) -> pa.ListArray:
    """``split`` without its empty strings, the tokens dictionary-encoded."""
    flat = pc.list_flatten(split)
    lengths = pc.binary_length(flat)
    offsets = split.offsets
    if len(flat) and pc.min(lengths).as_py() == 0:
        keep = pc.greater(lengths, 0)
        flat = pc.filter(flat, keep)
        parents = pc.filter(pc.list_parent_indices(split), keep)
        lengths = np.bincount(parents.to_numpy(zero_copy_only=False), minlength=len(split))
        bounds = np.zeros(len(split) + 1, dtype=np.int32)
        np.cumsum(lengths, out=bounds[1:])
        offsets = pa.array(bounds)
    return pa.ListArray.from_arrays(offsets, pc.dictionary_encode(flat))


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
        """Lines → (``list<string>`` sentences, index of the line each came from); a blank line
        gives none.

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
    def for_format(corpus_format: str, lang: str = "en") -> Tokenizer:
        """``moses`` in ``lang`` for raw ``text``; ``whitespace`` for the already tokenized
        formats (``tokenized``, ``1b-benchmark``)."""
        return MosesTokenizer(lang) if corpus_format == "text" else WhitespaceTokenizer()


class WhitespaceTokenizer(Tokenizer):
    """Already tokenized text: one sentence per line, split on whitespace, case kept."""

    name = "whitespace"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "sentence_per_line": True, "lowercase": False}

    def tokenize(self, text: str) -> list[list[str]]:
        return [tokens] if (tokens := text.split()) else []

    def tokenize_lines(self, lines: pa.Array) -> tuple[pa.ListArray, np.ndarray]:
        sentences = split_whitespace(lines)
        offsets = sentences.offsets.to_numpy()
        origin = np.flatnonzero(np.diff(offsets))
        if len(origin) == len(lines):
            return sentences, origin
        # a blank line has no tokens: its sentence ends where it starts, so dropping its
        # offset leaves every other sentence's tokens in place
        kept = np.append(offsets[origin], offsets[-1]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(kept), sentences.values), origin


# Quotes and brackets that open or close a sentence, German „…“ and French « … » included.
_OPENERS = "\"'“‘„‚«»(["
_CLOSERS = "\"'”’“‘»«)]"
# End punctuation, optional closers, whitespace, then the next sentence's first letter or digit
# (group 2) after optional openers; whether that starts a sentence is decided in Python, where
# upper case is known for every script.
_BOUNDARY = re.compile(rf"([.?!]+[{re.escape(_CLOSERS)}]*)\s+(?=[{re.escape(_OPENERS)}]*(\w))")
_LAST_WORD = re.compile(r"(\S+)$")
MOSES_LANGUAGES = frozenset(get_args(MosesLanguage))


class MosesTokenizer(Tokenizer):
    """Moses-style sentence splitting and tokenization (sacremoses), case kept.

    Sentence splitting follows Moses' ``split-sentences.perl`` in spirit: a boundary is end
    punctuation followed by whitespace and an upper-case letter or a digit (in any script, after
    optional opening quotes), unless the word before is a nonbreaking prefix of the language
    ("Mr.", "Dr.", German "z.B." and "Nr.", single letters). Scripts without case (Chinese, the
    Indic scripts) are not split within a line. ``lang`` must be one sacremoses ships prefixes
    for: sacremoses itself would fall back to the English ones without a word.
    """

    name = "moses"

    def __init__(
        self, lang: str = "en", escape: bool = False, aggressive_dash_splits: bool = False
    ) -> None:
        if lang not in MOSES_LANGUAGES:
            raise ConfigError(
                f"unknown language {lang!r}; sacremoses has Moses' nonbreaking prefixes for "
                f"{', '.join(sorted(MOSES_LANGUAGES))}",
                key="tokenizer.lang",
            )
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
            first = match.group(2)
            if not (first.isupper() or first.isdecimal()):
                continue
            before = text[start : match.start(1)]
            word = _LAST_WORD.search(before)
            if match.group(1) == "." and word is not None:
                stem = word.group(1).lstrip(_OPENERS)
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
