"""``manifest.json``: what a prepared dataset holds, how it was made, and every shard's checksum.

Written last by prepare, atomically, so a dataset directory with a manifest is complete.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from elmo_core.config import CorpusFormat, PrepareConfig
from elmo_core.errors import DataError
from elmo_core.location import join_url, open_url, sha256_of

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShardInfo(_Record):
    """One Parquet shard: its path relative to the dataset root and what it holds."""

    path: str
    sha256: str
    num_sentences: int
    num_tokens: int  # without sentence markers
    num_row_groups: int
    source_files: list[str] = []  # heldout shards: the input file(s) the rows came from


class SplitStats(_Record):
    """What reading the split's inputs skipped or repaired (all counts, never errors)."""

    lines: int = 0
    blank_lines: int = 0
    invalid_utf8_replacements: int = 0
    long_lines_split: int = 0
    long_lines_dropped: int = 0
    truncated_tokens: int = 0  # occurrences of tokens over 48 UTF-8 bytes (cut by the char ids)

    def __add__(self, other: SplitStats) -> SplitStats:
        return SplitStats(**{k: v + getattr(other, k) for k, v in self.model_dump().items()})


class SplitInfo(_Record):
    """One split (``train`` or ``heldout``): inputs, sizes, OOV rate, stats and shards."""

    files: list[str]  # input files, relative to the corpus root
    num_sentences: int
    num_tokens: int  # without sentence markers
    num_oov_tokens: int
    oov_rate: float
    stats: SplitStats
    shards: list[ShardInfo]


class VocabInfo(_Record):
    path: str = "vocab.txt"
    counts_path: str = "vocab_counts.tsv"
    size: int
    sha256: str
    imported_from: str | None = None


class WordTypesInfo(_Record):
    path: str = "word_types.parquet"
    num_types: int
    sha256: str


class Manifest(_Record):
    """The whole ``manifest.json``."""

    schema_version: int = MANIFEST_SCHEMA_VERSION
    shard_format: str
    shard_format_version: int
    source: str
    format: CorpusFormat
    tokenizer: dict[str, Any]  # Tokenizer.describe(); Tokenizer.from_manifest rebuilds it
    params: PrepareConfig
    vocab: VocabInfo
    word_types: WordTypesInfo
    splits: dict[str, SplitInfo]
    stats: SplitStats  # totals over the splits

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise DataError(f"no split {name!r}; the dataset has {sorted(self.splits)}")
        return self.splits[name]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"invalid JSON: {err.msg}", path=where, line=err.lineno) from None
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version != MANIFEST_SCHEMA_VERSION:
            raise DataError(
                f"manifest schema version {version!r}, this code reads {MANIFEST_SCHEMA_VERSION}",
                path=where,
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            key = ".".join(str(part) for part in first["loc"])
            raise DataError(f"key '{key}': {first['msg']}", path=where) from None


def load_manifest(dataset_url: str) -> Manifest:
    """The manifest of a prepared dataset (local directory or fsspec URL such as ``s3://...``)."""
    url = join_url(dataset_url, MANIFEST_NAME)
    try:
        with open_url(url, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise DataError(
            "no manifest.json: not a prepared dataset, or prepare did not finish", path=url
        ) from None
    return Manifest.from_json(text, url)


def manifest_sha256(dataset_url: str) -> str:
    """sha256 of the dataset's ``manifest.json``: it names every shard by checksum, so it
    identifies the dataset's content."""
    url = join_url(dataset_url, MANIFEST_NAME)
    try:
        with open_url(url) as handle:
            return sha256_of(handle)
    except FileNotFoundError:
        raise DataError("no manifest.json: not a prepared dataset", path=url) from None
