"""The steps of a prepare run: heldout parts numbered across files, the manifest's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import ShardInfo, SplitStats
from pipelines.prepare.inputs import FileTask, SourceFile
from pipelines.prepare.output import CountSummary
from pipelines.prepare.run import PhaseClock, heldout_part_names, num_train_shards, split_info

CFG = PrepareConfig(format="1b-benchmark", sentences_per_shard=10)


def summary(heldout_sentences: list[int], num_train: int = 25) -> CountSummary:
    return CountSummary(
        stats={"train": SplitStats(), "heldout": SplitStats()},
        num_sentences={"train": num_train, "heldout": sum(heldout_sentences)},
        num_tokens={"train": 100, "heldout": 40},
        num_oov_tokens={"train": 5, "heldout": 4},
        heldout_sentences=heldout_sentences,
        vocab_size=10,
        num_types=20,
        imported_vocab=None,
        checksums={},
        type_order="t",
    )


def tasks(roles: list[Literal["train", "heldout"]]) -> list[FileTask]:
    return [
        FileTask(SourceFile(i, Path(f"f{i}"), f"f{i}", role), CFG, {}, False, Path(f"s{i}"))
        for i, role in enumerate(roles)
    ]


def test_heldout_parts_are_numbered_across_files_in_input_order():
    names = heldout_part_names(tasks(["train", "heldout", "heldout"]), summary([0, 21, 3]), CFG)
    assert names == [
        [],
        ["heldout/part-00000.parquet", "heldout/part-00001.parquet", "heldout/part-00002.parquet"],
        ["heldout/part-00003.parquet"],
    ]
    assert num_train_shards(summary([0], num_train=25), CFG) == 3
    assert num_train_shards(summary([0], num_train=0), CFG) == 1


def test_a_split_whose_shards_disagree_with_the_count_is_refused():
    count = summary([0, 10])
    shard = ShardInfo(
        path="heldout/p", sha256="x", num_sentences=10, num_tokens=40, num_row_groups=1
    )
    info = split_info(count, "heldout", [shard], ["f1"])
    assert (info.num_sentences, info.oov_rate) == (10, pytest.approx(0.1))
    with pytest.raises(RuntimeError, match="heldout: shards disagree with the count"):
        split_info(count, "heldout", [shard, shard], ["f1"])


def test_the_clock_adds_the_laps_of_a_phase():
    clock = PhaseClock()
    clock.lap("count")
    clock.lap("encode")
    clock.lap("count")
    assert list(clock.seconds) == ["count", "encode"]
    assert all(seconds >= 0 for seconds in clock.seconds.values())
