"""The task data adapt and analyze share: configs refused before any work, splits read with one
label set, and each split's activations from the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elmo_core.errors import ConfigError, DataError
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.tasks import load_task_config
from elmo_core.tasks.task_config import TaskConfig
from pipelines.common.task_data import cache_splits, check_tasks, read_splits, task_inputs


def _task(root: Path, name: str = "questions", dev: list[str] | None = None) -> TaskConfig:
    (root / "q.train").write_text("DESC\thow does it work ?\nLOC\twhere is it ?\n")
    lines = dev if dev is not None else ["LOC\twhere was it ?"]
    (root / "q.dev").write_text("\n".join(lines) + "\n")
    config = root / f"{name}.yaml"
    config.write_text(
        f"name: {name}\ntype: classification\nformat: tsv\ntrain: q.train\ndev: q.dev\n"
    )
    return load_task_config(config)


def test_no_task_two_tasks_of_one_name_or_a_missing_file_are_refused(tmp_path: Path) -> None:
    task = _task(tmp_path)
    check_tasks([task])
    with pytest.raises(ConfigError, match="no task"):
        check_tasks([])
    with pytest.raises(ConfigError, match="two tasks named questions"):
        check_tasks([task, task])
    (tmp_path / "q.dev").unlink()
    with pytest.raises(DataError, match="dev file not found"):
        check_tasks([task])


def test_splits_are_read_with_train_labels_and_cached_with_their_activations(
    tmp_path: Path,
) -> None:
    datasets = read_splits(_task(tmp_path))
    assert sorted(datasets) == ["dev", "train"]

    torch.manual_seed(0)
    bilm = BiLM(tiny(), vocab_size=100).eval()
    splits = cache_splits(bilm, datasets, tmp_path / "cache")
    again = cache_splits(bilm, datasets, tmp_path / "cache")

    assert splits["train"].dataset is datasets["train"]
    first, second = splits["dev"].activations, again["dev"].activations
    assert first is not None and second is not None
    assert first.num_layers == second.num_layers


def test_a_dev_label_train_never_saw_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError):
        read_splits(_task(tmp_path, dev=["NUM\thow many ?"]))


def test_a_tasks_inputs_follow_its_config_and_file_contents_not_where_the_files_lie(
    tmp_path: Path,
) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    inputs = task_inputs(_task(here))

    assert task_inputs(_task(there)) == inputs  # the same files, moved
    assert "train" not in inputs and set(inputs["files"]) == {"train", "dev"}
    assert task_inputs(_task(there, dev=["DESC\thow was it ?"])) != inputs  # an edited file
    other = _task(here).model_copy(update={"labels": ["LOC", "DESC"]})
    assert task_inputs(other) != inputs  # the config
