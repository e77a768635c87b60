"""The checkpoint store: only committed checkpoints count, the newest is found whatever is on
disk, and pruning keeps the newest ``keep`` and nothing half-written; locally and on an object
store (fsspec's memory filesystem)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elmo_core.model.serialization import LATEST_FILE, find_model_dir
from pipelines.train.checkpoint import CheckpointStore, StoredCheckpoint
from pipelines.train.run_directory import RunDirectory


def _part(root: Path, rank: int) -> Path:
    """A rank's part as write_checkpoint lays it out (contents do not matter here)."""
    part = root / f"part-{rank}"
    (part / "model").mkdir(parents=True)
    (part / "model" / "model_config.json").write_text("{}")
    (part / f"rank_{rank}.pt").write_bytes(b"rank")
    if rank == 0:
        (part / "trainer.pt").write_bytes(b"trainer")
    return part


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path: Path) -> CheckpointStore:
    url = str(tmp_path / "run") if request.param == "local" else f"memory://{tmp_path.name}/run"
    return CheckpointStore(RunDirectory(url))


def _save(store: CheckpointStore, tmp_path: Path, step: int, ranks: int = 2) -> None:
    for rank in range(ranks):
        store.save_part(step, _part(tmp_path / f"step-{step}", rank))


def test_a_checkpoint_counts_only_once_committed(store, tmp_path) -> None:
    assert store.newest() is None
    _save(store, tmp_path, 10)
    assert store.newest() is None  # every part is there, but rank 0 has not committed it
    store.commit(10, world_size=2, keep=2)
    assert store.newest() == StoredCheckpoint(10)
    assert store.run_dir.read_json("checkpoints/step_000010/COMPLETE") == {
        "step": 10,
        "world_size": 2,
    }


def test_the_newest_complete_checkpoint_wins_over_older_and_half_written_ones(
    store, tmp_path
) -> None:
    for step in (10, 20, 30):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=3)
    _save(store, tmp_path, 40, ranks=1)  # killed while saving step 40
    assert [c.step for c in store.complete()] == [10, 20, 30]
    assert store.newest() == StoredCheckpoint(30)
    assert store.remove_incomplete() == [StoredCheckpoint(40)]
    assert [c.step for c in store.complete()] == [10, 20, 30]
    assert store.run_dir.subdirectories("checkpoints") == [
        "step_000010",
        "step_000020",
        "step_000030",
    ]


def test_commit_prunes_to_keep_and_removes_orphans(store, tmp_path) -> None:
    _save(store, tmp_path, 5, ranks=1)  # an orphan a crashed attempt left
    for step in (10, 20, 30):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=2)
    assert store.run_dir.subdirectories("checkpoints") == ["step_000020", "step_000030"]


def test_a_rank_reads_its_part_and_the_shared_files(store, tmp_path) -> None:
    _save(store, tmp_path, 10)
    store.commit(10, world_size=2, keep=2)
    with store.opened(StoredCheckpoint(10), rank=1) as directory:
        assert (directory / "rank_1.pt").read_bytes() == b"rank"
        assert (directory / "trainer.pt").read_bytes() == b"trainer"
        assert (directory / "model" / "model_config.json").is_file()


def test_latest_points_evaluate_at_the_newest_checkpoint(tmp_path) -> None:
    store = CheckpointStore(RunDirectory(str(tmp_path / "run")))
    for step in (10, 20):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=2)
    assert (tmp_path / "run" / LATEST_FILE).read_text().strip() == "checkpoints/step_000020"
    assert find_model_dir(tmp_path / "run") == tmp_path / "run/checkpoints/step_000020/model"
