"""The resumption record: typed, round-trips through JSON, and a new type order voids its files."""

from __future__ import annotations

from elmo_core.data.manifest import ShardInfo, SplitStats
from pipelines.prepare.state import CountSummary, PrepareState


def count(type_order: str) -> CountSummary:
    return CountSummary(
        stats={"train": SplitStats(), "heldout": SplitStats()},
        num_sentences={"train": 4, "heldout": 1},
        num_tokens={"train": 12, "heldout": 3},
        num_oov_tokens={"train": 1, "heldout": 0},
        heldout_sentences=[0, 1],
        vocab_size=7,
        num_types=9,
        imported_vocab=None,
        checksums={"vocab.txt": "a", "vocab_counts.tsv": "b"},
        type_order=type_order,
    )


def shard(path: str) -> ShardInfo:
    return ShardInfo(path=path, sha256="c", num_sentences=4, num_tokens=12, num_row_groups=1)


def test_state_round_trips_through_json_with_its_count_typed():
    state = PrepareState(fingerprint="f", count=count("t1"), word_types="w")
    state.shards["train/part-00000.parquet"] = shard("train/part-00000.parquet")
    loaded = PrepareState.model_validate_json(state.model_dump_json())
    assert loaded == state
    assert isinstance(loaded.count, CountSummary) and loaded.count.type_order == "t1"


def test_the_same_type_order_keeps_finished_files_and_another_voids_them():
    state = PrepareState(fingerprint="f", count=count("t1"), word_types="w")
    state.shards["heldout/part-00000.parquet"] = shard("heldout/part-00000.parquet")
    state.restart_with(count("t1"))
    assert state.word_types == "w" and list(state.shards) == ["heldout/part-00000.parquet"]
    state.restart_with(count("t2"))
    assert state.word_types is None and state.shards == {}
    assert state.count is not None and state.count.type_order == "t2"
    fresh = PrepareState(fingerprint="f")
    fresh.restart_with(count("t1"))
    assert fresh.count == count("t1")
