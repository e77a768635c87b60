"""Stream a prepared dataset's split as token-id arrays, partitioned over workers.

Ranks split by shard, by row group, or by sentence for a small split, so every worker gets data
and the ranks' union is the split, each sentence once.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from elmo_core.data.manifest import Manifest, ShardInfo, load_manifest
from elmo_core.data.shards import SHARD_FORMAT_VERSION, char_ids_matrix, flat_lists, target_ids
from elmo_core.errors import DataError
from elmo_core.location import file_version, join_url, open_url, sha256_of
from elmo_core.text.vocab import Vocabulary, read_vocab, read_vocab_counts

__all__ = [
    "SentenceBatch",
    "WordTypes",
    "iter_sentences",
    "load_manifest",
    "load_vocab",
    "load_word_types",
    "ReadUnit",
    "partition_split",
    "read_unit",
    "select_shards",
]


@dataclass(frozen=True)
class SentenceBatch:
    """The sentences of one row group, flat: sentence i is ``types[offsets[i]:offsets[i+1]]``.

    No sentence markers are included; ``<S>``/``</S>`` are type and vocabulary ids 0 and 1.
    """

    types: np.ndarray  # (N,) int32 word-type ids (rows of word_types.parquet)
    targets: np.ndarray  # (N,) int32 vocabulary ids, OOV → 2 (<UNK>)
    offsets: np.ndarray  # (S+1,) int64
    shard: str  # shard path relative to the dataset root
    row_group: int
    source_files: list[str] | None = None  # heldout: (S,) input file of each sentence
    lines: np.ndarray | None = None  # heldout: (S,) int64 1-based line in that file

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


@dataclass(frozen=True)
class WordTypes:
    """``word_types.parquet`` as arrays; row = type id."""

    tokens: pa.Array  # (Y,) string
    counts: np.ndarray  # (Y,) int64 training occurrences
    heldout_counts: np.ndarray  # (Y,) int64
    vocab_ids: np.ndarray  # (Y,) int32 target id of each type (2 for OOV types)
    char_ids: np.ndarray  # (Y, 50) int16, +1/262 convention

    def __len__(self) -> int:
        return len(self.tokens)


def load_vocab(dataset_url: str, manifest: Manifest | None = None) -> Vocabulary:
    """The dataset's target vocabulary with its training counts."""
    manifest = manifest or load_manifest(dataset_url)
    vocab = read_vocab(join_url(dataset_url, manifest.vocab.path))
    return read_vocab_counts(join_url(dataset_url, manifest.vocab.counts_path), vocab)


def load_word_types(dataset_url: str, manifest: Manifest | None = None) -> WordTypes:
    """Every word type of the dataset with its char ids (checksum verified)."""
    manifest = manifest or load_manifest(dataset_url)
    info = manifest.word_types
    url = join_url(dataset_url, info.path)
    _verify_shard(url, info.sha256)
    with open_url(url) as handle:
        table = pq.read_table(handle)
    return WordTypes(
        tokens=table["token"].combine_chunks(),
        counts=table["count"].to_numpy(),
        heldout_counts=table["heldout_count"].to_numpy(),
        vocab_ids=table["vocab_id"].to_numpy(),
        char_ids=char_ids_matrix(table["char_ids"]),
    )


def select_shards(
    manifest: Manifest, split: str, files: Sequence[str] | None = None
) -> list[ShardInfo]:
    """The split's shards, or only those from input files matching ``files`` (heldout).

    Each pattern is an fnmatch pattern on the file's name; one without wildcards matches as a
    substring, so ``"heldout-00000"`` selects ``news.en.heldout-00000-of-00050``.
    """
    if manifest.shard_format_version != SHARD_FORMAT_VERSION:
        raise DataError(
            f"the shards are in format version {manifest.shard_format_version}; this code reads "
            f"version {SHARD_FORMAT_VERSION}: run `elmo prepare` again"
        )
    shards = manifest.split(split).shards
    if files is None:
        return list(shards)
    if any(not shard.source_files for shard in shards):
        raise DataError(f"split {split!r} does not record source files; select files on heldout")
    chosen = [s for s in shards if any(_matches(f, p) for f in s.source_files for p in files)]
    if not chosen:
        known = sorted({f for shard in shards for f in shard.source_files})
        raise DataError(f"no {split} file matches {list(files)}; files: {known[:5]}...")
    return chosen


def _matches(name: str, pattern: str) -> bool:
    if any(char in pattern for char in "*?["):
        return fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(name.rsplit("/", 1)[-1], pattern)
    return pattern in name


@dataclass(frozen=True)
class ReadUnit:
    """A rank's share of one row group: its rows ``first::step`` (all of them by default)."""

    shard: ShardInfo
    group: int
    first: int = 0
    step: int = 1


def partition_split(
    dataset_url: str, shards: Sequence[ShardInfo], rank: int, world_size: int
) -> list[ReadUnit]:
    """This rank's units: whole shards round-robin, else row groups, else dealt sentences.

    Dealing reads the row groups' sizes from the Parquet footers; it only happens when the split
    has fewer row groups than workers, so a few small files.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    if len(shards) >= world_size:
        return [
            ReadUnit(shard, group)
            for shard in shards[rank::world_size]
            for group in range(shard.num_row_groups)
        ]
    groups = [(shard, group) for shard in shards for group in range(shard.num_row_groups)]
    if len(groups) >= world_size:
        return [ReadUnit(shard, group) for shard, group in groups[rank::world_size]]
    units, offset = [], 0  # sentence i of the split (in shard, group order) goes to i % world_size
    for shard in shards:
        with open_url(join_url(dataset_url, shard.path)) as handle:
            metadata = pq.ParquetFile(handle).metadata
        for group in range(shard.num_row_groups):
            first = (rank - offset) % world_size
            if first < metadata.row_group(group).num_rows:
                units.append(ReadUnit(shard, group, first, world_size))
            offset += metadata.row_group(group).num_rows
    return units


def iter_sentences(
    dataset_url: str,
    split: str = "train",
    *,
    rank: int = 0,
    world_size: int = 1,
    files: Sequence[str] | None = None,
    manifest: Manifest | None = None,
) -> Iterator[SentenceBatch]:
    """Stream this rank's part of ``split`` as one :class:`SentenceBatch` per row group.

    Order: the manifest's shard order, then row groups in order (the training split was shuffled
    when prepared; shuffle shard order per epoch on top of this if wanted). Memory: one shard.
    """
    manifest = manifest or load_manifest(dataset_url)
    shards = select_shards(manifest, split, files)
    for unit in partition_split(dataset_url, shards, rank, world_size):
        batch = read_unit(dataset_url, unit, files, vocab_size=manifest.vocab.size)
        if batch.num_sentences:
            yield batch


def read_unit(
    dataset_url: str,
    unit: ReadUnit,
    files: Sequence[str] | None = None,
    *,
    vocab_size: int,
) -> SentenceBatch:
    """A unit's rows of a row group (only its bytes are read once the shard has been verified).

    Shards store type ids only; the targets are the vocabulary's own ids (type id = vocabulary
    id below ``vocab_size``, the manifest's ``vocab.size``) and ``<UNK>`` for every other type.

    The shard's sha256 is checked the first time this process opens it, and again whenever its
    size or modification time changes, so a training stream that visits row groups in shuffled
    order does not re-hash whole shards for every group.
    """
    url = join_url(dataset_url, unit.shard.path)
    _verify_shard(url, unit.shard.sha256)
    with open_url(url) as handle:
        table = pq.ParquetFile(handle).read_row_group(unit.group)
    batch = _to_batch(table, unit.shard.path, unit.group, vocab_size)
    if unit.step > 1:
        dealt = np.zeros(batch.num_sentences, dtype=bool)
        dealt[unit.first :: unit.step] = True
        batch = _keep(batch, dealt)
    if files is not None and batch.source_files is not None:
        keep = np.array([any(_matches(f, p) for p in files) for f in batch.source_files], bool)
        batch = _keep(batch, keep)
    return batch


_VERIFIED: set[tuple[str, str, str]] = set()


def _verify_shard(url: str, sha256: str) -> None:
    try:
        version = file_version(url)
    except FileNotFoundError:
        raise DataError(
            "shard listed in the manifest is missing: re-run prepare, which repairs it", path=url
        ) from None
    if (url, sha256, version) in _VERIFIED:
        return
    with open_url(url) as handle:
        digest = sha256_of(handle)
    if digest != sha256:
        raise DataError(
            "shard checksum does not match the manifest (corrupt or changed): re-run prepare, "
            "which repairs it",
            path=url,
        )
    _VERIFIED.add((url, sha256, version))


def _to_batch(table: pa.Table, shard: str, group: int, vocab_size: int) -> SentenceBatch:
    values, offsets = flat_lists(table["types"].combine_chunks())
    types = values.to_numpy()
    source_files = lines = None
    if "source_file" in table.column_names:
        source_files = table["source_file"].to_pylist()
        lines = table["line"].to_numpy()
    return SentenceBatch(
        types=types,
        targets=target_ids(types, vocab_size),
        offsets=offsets,
        shard=shard,
        row_group=group,
        source_files=source_files,
        lines=lines,
    )


def _keep(batch: SentenceBatch, keep: np.ndarray) -> SentenceBatch:
    """The batch's sentences where ``keep`` (S,) is true."""
    if keep.all():
        return batch
    starts, ends = batch.offsets[:-1][keep], batch.offsets[1:][keep]
    token_index = np.concatenate(
        [np.arange(s, e) for s, e in zip(starts, ends, strict=True)] or [np.zeros(0, np.int64)]
    )
    offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
    return SentenceBatch(
        types=batch.types[token_index],
        targets=batch.targets[token_index],
        offsets=offsets,
        shard=batch.shard,
        row_group=batch.row_group,
        source_files=None
        if batch.source_files is None
        else [f for f, k in zip(batch.source_files, keep, strict=True) if k],
        lines=None if batch.lines is None else batch.lines[keep],
    )
