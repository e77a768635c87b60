"""Reader: partitioning over ranks, heldout file selection, manifest errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo, load_manifest
from elmo_core.data.reader import iter_sentences, partition_split, select_shards
from elmo_core.errors import DataError
from pipelines.prepare.stage import prepare_files


class _Corpus:
    def __init__(self, root: Path) -> None:
        self.source = str(root)
        self.train, self.heldout = [], []
        rng = np.random.default_rng(0)
        for split, count, lines in (("train", 2, 130), ("heldout", 3, 25)):
            for number in range(count):
                path = root / f"news.en.{split}-{number:05d}-of-0000{count}"
                path.parent.mkdir(parents=True, exist_ok=True)
                rows = [
                    " ".join(f"w{k}" for k in rng.integers(0, 50, rng.integers(1, 9)))
                    for _ in range(lines)
                ]
                path.write_text("\n".join(rows) + "\n")
                getattr(self, split).append(path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("reader")
    cfg = PrepareConfig(format="1b-benchmark", sentences_per_shard=100, sentences_per_row_group=20)
    prepare_files(cfg, _Corpus(root / "corpus"), str(root / "out"))
    return str(root / "out")


def _sentences(dataset: str, split: str, **options) -> list[tuple[str, int, int]]:
    """(shard, row group, sentence index) of every sentence a call yields."""
    return [
        (batch.shard, batch.row_group, i)
        for batch in iter_sentences(dataset, split, **options)
        for i in range(batch.num_sentences)
    ]


@pytest.mark.parametrize("split", ["train", "heldout"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_ranks_are_disjoint_and_together_are_the_whole_split(dataset, split, world_size):
    whole = _sentences(dataset, split)
    parts = [_sentences(dataset, split, rank=r, world_size=world_size) for r in range(world_size)]
    assert sorted(s for part in parts for s in part) == sorted(whole)
    assert sum(map(len, parts)) == len(whole) == load_manifest(dataset).splits[split].num_sentences


def test_fewer_shards_than_workers_partitions_row_groups():
    shards = [
        ShardInfo(path=f"p{i}", sha256="", num_sentences=1, num_tokens=1, num_row_groups=3)
        for i in range(2)
    ]
    plans = [partition_split("unread", shards, rank, 4) for rank in range(4)]
    units = [(unit.shard.path, unit.group, unit.step) for plan in plans for unit in plan]
    assert sorted(units) == [(f"p{i}", g, 1) for i in range(2) for g in range(3)]
    assert all(plans)
    with pytest.raises(ValueError):
        partition_split("unread", shards, 4, 4)


@pytest.fixture(scope="module")
def one_row_group(tmp_path_factory) -> str:
    """Seven train sentences in one shard of one row group: fewer row groups than workers."""
    root = tmp_path_factory.mktemp("one-row-group")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(f"sentence {i} of seven" for i in range(7)) + "\n")
    cfg = PrepareConfig(format="text", heldout_fraction=0.0)
    prepare_files(cfg, _TextCorpus(corpus), str(root / "out"))
    return str(root / "out")


class _TextCorpus:
    def __init__(self, path: Path) -> None:
        self.source, self.train, self.heldout = str(path), [path], []


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_fewer_row_groups_than_workers_deals_sentences_to_every_rank(one_row_group, world_size):
    shards = load_manifest(one_row_group).splits["train"].shards
    assert sum(shard.num_row_groups for shard in shards) == 1
    whole = [
        batch.types[batch.offsets[i] : batch.offsets[i + 1]].tolist()
        for batch in iter_sentences(one_row_group)
        for i in range(batch.num_sentences)
    ]
    for rank in range(world_size):
        mine = [
            batch.types[batch.offsets[i] : batch.offsets[i + 1]].tolist()
            for batch in iter_sentences(one_row_group, rank=rank, world_size=world_size)
            for i in range(batch.num_sentences)
        ]
        assert mine == whole[rank::world_size]


def test_heldout_files_are_selected_by_name(dataset):
    manifest = load_manifest(dataset)
    chosen = select_shards(manifest, "heldout", ["heldout-00000"])
    assert [s.source_files for s in chosen] == [["news.en.heldout-00000-of-00003"]]
    batches = list(iter_sentences(dataset, "heldout", files=["heldout-00000"]))
    assert {f for b in batches for f in b.source_files} == {"news.en.heldout-00000-of-00003"}
    assert sum(b.num_sentences for b in batches) == 25
    assert batches[0].lines[:3].tolist() == [1, 2, 3]
    others = list(iter_sentences(dataset, "heldout", files=["*heldout-0000[12]*"]))
    assert sum(b.num_sentences for b in others) == 50
    with pytest.raises(DataError, match="no heldout file matches"):
        select_shards(manifest, "heldout", ["heldout-00042"])
    with pytest.raises(DataError, match="does not record source files"):
        select_shards(manifest, "train", ["train-00000"])


def test_missing_manifest_and_unknown_split_are_data_errors(dataset, tmp_path):
    with pytest.raises(DataError, match="no manifest.json"):
        load_manifest(str(tmp_path))
    with pytest.raises(DataError, match="no split 'valid'"):
        list(iter_sentences(dataset, "valid"))


def test_shards_of_another_format_version_are_refused_with_the_fix(dataset):
    older = load_manifest(dataset).model_copy(update={"shard_format_version": 1})
    with pytest.raises(DataError, match=r"format version 1; this code reads version 3.*prepare"):
        select_shards(older, "train")


def test_targets_are_the_vocabulary_ids_of_the_stored_types(tmp_path):
    """Shards hold type ids only: vocabulary types are their own target, every other is <UNK>."""
    cfg = PrepareConfig(format="1b-benchmark", max_vocab=20)
    dataset = str(tmp_path / "out")
    prepare_files(cfg, _Corpus(tmp_path / "corpus"), dataset)
    vocab_size = load_manifest(dataset).vocab.size
    batches = list(iter_sentences(dataset, "train"))
    types = np.concatenate([batch.types for batch in batches])
    targets = np.concatenate([batch.targets for batch in batches])
    assert (types >= vocab_size).any() and (types < vocab_size).any()
    np.testing.assert_array_equal(targets, np.where(types < vocab_size, types, 2))
