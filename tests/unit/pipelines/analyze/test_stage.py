"""The analysis's head width: its own default where a task file sets none, the file's otherwise."""

from __future__ import annotations

from pathlib import Path

from elmo_core.tasks import load_task_config
from pipelines.analyze.stage import ANALYSIS_HEAD_DIM, analysis_task

TASK = "name: tagger\ntype: tagging\nformat: conll2003\ntrain: t.txt\n"


def _task(tmp_path: Path, extra: str = "", overrides: tuple[str, ...] = ()):
    path = tmp_path / "task.yaml"
    path.write_text(TASK + extra)
    return load_task_config(path, overrides)


def test_a_task_file_without_a_head_width_gets_the_analysis_width(tmp_path: Path) -> None:
    task = _task(tmp_path, "head:\n  dropout: 0.3\n")
    analysed = analysis_task(task)
    assert task.head.hidden_dim == 200 != ANALYSIS_HEAD_DIM  # the task default, for adapt
    assert analysed.head.hidden_dim == ANALYSIS_HEAD_DIM
    assert analysed.head.dropout == 0.3 and analysed.name == task.name  # nothing else moves


def test_a_width_the_file_or_an_override_gives_is_kept(tmp_path: Path) -> None:
    assert analysis_task(_task(tmp_path, "head:\n  hidden_dim: 200\n")).head.hidden_dim == 200
    overridden = _task(tmp_path, overrides=("head.hidden_dim=128",))
    assert analysis_task(overridden).head.hidden_dim == 128
