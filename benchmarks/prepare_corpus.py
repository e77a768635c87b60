"""The benchmark corpus of bench_prepare: real English text copied to any size, 1B Word layout.

PTB (already tokenized) and the plain-text books (a cheap regex split of punctuation, sentences
cut at ``.``/``!``/``?``) are copied until the requested bytes of whitespace-tokenized text, in the
1B Word Benchmark layout (``training-monolingual.tokenized.shuffled/news.en-000NN-of-00100``,
``heldout-monolingual.tokenized.shuffled/news.en.heldout-000NN-of-00050``). Copy k shuffles the
sentences and respells a fraction ``MUTATE_FRACTION / k**0.45`` of the tokens of rarer types as
``word_<k><letter>``, so the type count keeps growing, sub-linearly, as a real corpus's does.
:func:`doubled_corpus` is the other way to grow: the same files twice, so the same word types.
Corpora are cached by their parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TRAIN_DIR = "training-monolingual.tokenized.shuffled"
HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
CORPUS_VERSION = 2  # bump when the generator changes: part of the cache key
MUTATE_FRACTION = 0.1  # copy k respells this / k**0.45 of the rare types' tokens
SPELLINGS = 16  # respellings of a type per copy
COMMON_TYPES = 1000  # the most frequent base types (at most a tenth) are never respelled
MAX_SENTENCE_TOKENS = 100
HELDOUT_FRACTION = 0.01
_WORD = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")
_VERSE = re.compile(r"^[A-Za-z]+\d+:\d+\s+", re.MULTILINE)  # kjv.txt's "Ge1:1 " prefixes
_PARAGRAPH = re.compile(r"\n\s*\n")
_CLOSING = frozenset("\"'”’)]")


def source_files(data_root: Path) -> tuple[list[Path], list[Path]]:
    """(tokenized PTB files, raw book files) under ``data_root``; empty when absent."""
    tokenized = sorted((data_root / "ptb").glob("*.txt")) if (data_root / "ptb").is_dir() else []
    raw = sorted((data_root / "text").rglob("*.txt")) if (data_root / "text").is_dir() else []
    return tokenized, raw


def book_sentences(text: str) -> Iterator[list[str]]:
    """Raw running text → sentences: words and punctuation split by regex, cut at end marks."""
    for paragraph in _PARAGRAPH.split(_VERSE.sub("", text)):
        sentence: list[str] = []
        ended = False  # an end mark was seen: the sentence ends before the next non-quote
        for token in _WORD.findall(paragraph):
            if (ended and token not in _CLOSING) or len(sentence) >= MAX_SENTENCE_TOKENS:
                yield sentence
                sentence, ended = [], False
            sentence.append(token)
            ended = ended or token in ".!?"
        if sentence:
            yield sentence


@dataclass(frozen=True)
class BaseCorpus:
    """The source sentences once, dictionary-encoded: copies are made from these arrays."""

    types: pa.Array  # (Y,) string
    ids: np.ndarray  # (N,) int32 type of each token
    offsets: np.ndarray  # (S+1,) int32 sentence bounds
    rare: np.ndarray  # (Y,) bool: not among the most frequent types


def read_base(tokenized: list[Path], raw: list[Path]) -> BaseCorpus:
    sentences = [
        tokens
        for path in tokenized
        for line in path.read_text(encoding="utf-8").splitlines()
        if (tokens := line.split())
    ]
    for path in raw:
        sentences.extend(book_sentences(path.read_text(encoding="utf-8", errors="replace")))
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int32, count=len(sentences))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    encoded = pc.dictionary_encode(pa.array([t for s in sentences for t in s], pa.string()))
    ids = encoded.indices.to_numpy().astype(np.int32)
    counts = np.bincount(ids, minlength=len(encoded.dictionary))
    rare = np.ones(len(counts), dtype=bool)
    rare[np.argsort(-counts, kind="stable")[: min(COMMON_TYPES, len(counts) // 10)]] = False
    return BaseCorpus(encoded.dictionary, ids, offsets, rare)


def corpus_copy(base: BaseCorpus, k: int, seed: int) -> pa.Array:
    """Copy ``k`` as lines ending in ``\\n``: sentences shuffled, some rare tokens respelled.

    A respelled token becomes ``word_<k><letter>``, one of ``SPELLINGS`` letters drawn per token,
    so most respellings are new, rare types (as a real corpus's new types are); with the rate
    falling as ``k ** -0.45`` the type count grows roughly as Heaps' law, ~1.6x when doubling.
    """
    rng = np.random.default_rng([seed, k])
    tokens = base.types.take(pa.array(base.ids))
    if k:
        chosen = rng.random(len(base.ids)) < MUTATE_FRACTION / k**0.45
        mutate = pa.array(base.rare[base.ids] & chosen)
        suffixes = pa.array([f"_{k}{chr(ord('a') + i)}" for i in range(SPELLINGS)])
        suffix = suffixes.take(pa.array(rng.integers(0, SPELLINGS, len(base.ids))))
        tokens = pc.if_else(mutate, pc.binary_join_element_wise(tokens, suffix, ""), tokens)
    sentences = pa.ListArray.from_arrays(pa.array(base.offsets), tokens)
    sentences = sentences.take(pa.array(rng.permutation(len(sentences))))
    return pc.binary_join_element_wise(pc.binary_join(sentences, " "), "", "\n")


def _write_lines(lines: pa.Array, handles: list[BinaryIO], start: int, stop: int) -> None:
    """Write lines ``start:stop`` spread evenly over ``handles`` (one contiguous run each)."""
    offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset :]
    data = memoryview(lines.buffers()[2])
    bounds = np.linspace(start, stop, len(handles) + 1).astype(np.int64)
    for handle, a, b in zip(handles, bounds[:-1], bounds[1:], strict=True):
        handle.write(data[offsets[a] : offsets[b]])


def build_corpus(
    data_root: Path,
    size_bytes: int,
    cache_dir: Path,
    *,
    train_files: int = 20,
    heldout_files: int = 2,
    seed: int = 0,
) -> Path:
    """The 1B-layout corpus of at least ``size_bytes`` training text, built once per parameters."""
    tokenized, raw = source_files(data_root)
    key = json.dumps(
        [CORPUS_VERSION, size_bytes, train_files, heldout_files, seed]
        + [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in tokenized + raw]
    )
    target = cache_dir / f"1b-{size_bytes}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if target.is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache_dir))
    (staging / TRAIN_DIR).mkdir()
    (staging / HELDOUT_DIR).mkdir()
    names = [f"{TRAIN_DIR}/news.en-{i + 1:05d}-of-00100" for i in range(train_files)]
    names += [f"{HELDOUT_DIR}/news.en.heldout-{i:05d}-of-00050" for i in range(heldout_files)]
    with ExitStack() as stack:
        handles = [stack.enter_context(open(staging / n, "wb", buffering=1 << 22)) for n in names]
        write_copies(read_base(tokenized, raw), handles, heldout_files, size_bytes, seed)
    staging.rename(target)
    return target


def write_copies(
    base: BaseCorpus, handles: list[BinaryIO], num_heldout_files: int, size_bytes: int, seed: int
) -> None:
    """Copies 0, 1, ... until ``size_bytes`` of training lines: 1% of each to the heldout files."""
    train, heldout = handles[:-num_heldout_files], handles[-num_heldout_files:]
    written, k = 0, 0
    while written < size_bytes:
        lines = corpus_copy(base, k, seed)
        num_heldout = max(num_heldout_files, round(HELDOUT_FRACTION * len(lines)))
        _write_lines(lines, heldout, 0, num_heldout)
        line_ends = np.cumsum(pc.binary_length(lines).to_numpy()[num_heldout:])
        num_train = int(np.searchsorted(line_ends, size_bytes - written)) + 1
        num_train = min(len(line_ends), max(len(train), num_train))  # no file left empty
        _write_lines(lines, train, num_heldout, num_heldout + num_train)
        written += int(line_ends[num_train - 1])
        k += 1


def corpus_files(corpus: Path) -> tuple[list[Path], list[Path]]:
    """(training, heldout) files of a 1B-layout corpus, sorted."""
    return sorted((corpus / TRAIN_DIR).iterdir()), sorted((corpus / HELDOUT_DIR).iterdir())


def doubled_corpus(corpus: Path) -> Path:
    """``corpus`` twice over with the same word types: each training file under two names.

    Files are hard links (copies where links fail), so the doubled corpus costs no disk.
    """
    target = corpus.with_name(f"{corpus.name}-twice")
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=corpus.parent))
    train, heldout = corpus_files(corpus)
    names = [f"{TRAIN_DIR}/news.en-{i + 1:05d}-of-00100" for i in range(2 * len(train))]
    sources = train + train + heldout
    names += [f"{HELDOUT_DIR}/{path.name}" for path in heldout]
    for directory in (TRAIN_DIR, HELDOUT_DIR):
        (staging / directory).mkdir()
    for source, name in zip(sources, names, strict=True):
        try:
            os.link(source, staging / name)
        except OSError:
            shutil.copyfile(source, staging / name)
    staging.rename(target)
    return target
