"""DatasetOutput: what prepare may write over, what a resumed run trusts, and publishing; the
resumption record: typed, round-trips through JSON, and a new type order voids its files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from elmo_core.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, SplitInfo, SplitStats
from elmo_core.errors import DataError
from elmo_core.location import Location
from pipelines.prepare.output import (
    STATE_NAME,
    WORD_TYPES_NAME,
    WORK_NAME,
    CountSummary,
    DatasetOutput,
    PrepareState,
)


def _shard(output: DatasetOutput, path: str, content: bytes) -> ShardInfo:
    """Write a shard under ``local_root`` as the gather pass does; its record."""
    (output.local_root / path).parent.mkdir(parents=True, exist_ok=True)
    (output.local_root / path).write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    return ShardInfo(path=path, sha256=digest, num_sentences=1, num_tokens=1, num_row_groups=1)


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))  # a remote output's staging
    if request.param == "local":
        return str(tmp_path / "dataset")
    return f"memory://{tmp_path.name}/dataset"


def test_a_new_output_is_claimed_and_a_resumed_run_keeps_its_verified_shards(url: str) -> None:
    output = DatasetOutput(url, "f1")
    output.claim(overwrite=False)
    state = output.load_state()
    assert state == PrepareState(fingerprint="f1")
    good, bad = _shard(output, "train/a", b"a"), _shard(output, "train/b", b"b")
    output.record_shard(state, good)
    output.record_shard(state, bad)
    Location(url).write_text("train/b", "corrupt")  # changed after it was recorded

    again = DatasetOutput(url, "f1")
    again.claim(overwrite=False)  # the same run: nothing removed
    resumed = again.load_state()
    assert list(resumed.shards) == ["train/a"]
    assert Location(url).names("train") == ["a", "b"]


def test_another_dataset_is_replaced_only_when_asked(url: str) -> None:
    first = DatasetOutput(url, "f1")
    first.claim(overwrite=False)
    first.save_state(first.load_state())
    first.write_text(MANIFEST_NAME, "{}")

    second = DatasetOutput(url, "f2")
    with pytest.raises(DataError, match="holds another dataset"):
        second.claim(overwrite=False)
    second.claim(overwrite=True)
    assert Location(url).names() == []


def test_files_prepare_did_not_write_are_never_touched(url: str) -> None:
    Location(url).write_text("notes.txt", "mine")
    with pytest.raises(DataError, match=r"did not write \(notes\.txt\)"):
        DatasetOutput(url, "f1").claim(overwrite=True)
    assert Location(url).read_text("notes.txt") == "mine"


def test_a_killed_runs_temporaries_and_stale_work_are_removed(tmp_path: Path) -> None:
    output = DatasetOutput(str(tmp_path / "dataset"), "f2")
    (tmp_path / "dataset" / "train").mkdir(parents=True)
    temporary = tmp_path / "dataset" / "train" / ".a.parquet.abcd1234"
    temporary.write_text("half")
    stale = tmp_path / "dataset" / WORK_NAME / "f1"
    stale.mkdir(parents=True)
    output.claim(overwrite=False)  # a temporary is not a foreign file
    output.load_state()
    assert not temporary.exists() and not stale.exists() and output.work.is_dir()


def test_unlisted_shards_are_removed_before_the_manifest(url: str) -> None:
    output = DatasetOutput(url, "f1")
    state = output.load_state()
    for path in ("train/a", "train/old", "heldout/h"):
        output.record_shard(state, _shard(output, path, path.encode()))
    kept = {"train": "train/a", "heldout": "heldout/h"}
    splits = {name: SplitInfo.model_construct(shards=[state.shards[kept[name]]]) for name in kept}
    output.remove_unlisted_shards(Manifest.model_construct(splits=splits))
    assert Location(url).names("train") == ["a"] and Location(url).names("heldout") == ["h"]


def test_a_remote_output_is_staged_locally_published_and_fetched_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    url = f"memory://{tmp_path.name}/remote"
    output = DatasetOutput(url, "f1")
    assert output.local_root.is_relative_to(tmp_path / "home")
    state = output.load_state()
    output.record_shard(state, _shard(output, "train/a", b"a"))
    assert not (output.local_root / "train" / "a").exists()  # uploaded, not kept twice
    digest = output.write_text("vocab.txt", "the\n")
    (output.local_root / "vocab.txt").unlink()
    assert output.has_all({"vocab.txt": digest})  # fetched from the published copy
    assert not output.has_all({"vocab.txt": "0" * 64})
    assert Location(url).names() == ["prepare_state.json", "train", "vocab.txt"]
    output.finish()
    assert not output.local_root.exists()


def test_word_types_are_recorded_and_dropped_when_changed(url: str) -> None:
    output = DatasetOutput(url, "f1")
    state = output.load_state()
    digest = output.write_local(WORD_TYPES_NAME, lambda path: _write(path, b"types"))
    output.record_word_types(state, digest)
    assert DatasetOutput(url, "f1").load_state().word_types == digest
    Location(url).write_text(WORD_TYPES_NAME, "other")
    assert DatasetOutput(url, "f1").load_state().word_types is None
    assert Location(url).read_json(STATE_NAME) is not None


def _write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return hashlib.sha256(content).hexdigest()


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
