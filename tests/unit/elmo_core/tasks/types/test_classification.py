"""The classification type: SST phrases train; dev and test are whole sentences."""

from __future__ import annotations

from pathlib import Path

from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.types.classification import Classification


def test_sst_phrases_are_read_for_train_only(tmp_path: Path) -> None:
    (tmp_path / "sst.txt").write_text("(3 (2 It) (4 (3 works) (2 .)))\n")
    task = TaskConfig(
        name="s",
        type="classification",
        format="sst",
        train=tmp_path / "sst.txt",
        reader={"sst_phrases": True},  # type: ignore[arg-type]
    )
    kind = Classification()
    phrases = kind.read(task, tmp_path / "sst.txt", "train")
    sentences = kind.read(task, tmp_path / "sst.txt", "test")
    assert len(sentences) == 1 and len(phrases) > 1
    assert [kind.gold(example) for example in sentences] == ["3"]
