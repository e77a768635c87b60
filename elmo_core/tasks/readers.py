"""Read a task's split with the reader its type and format name, and settle its label set."""

from __future__ import annotations

from typing import Any

from elmo_core.errors import ConfigError, DataError
from elmo_core.tasks.dataset import TaskDataset
from elmo_core.tasks.task_config import Split, TaskConfig
from elmo_core.tasks.types import task_type

AnyDataset = TaskDataset[Any]  # of the examples its type's reader returns


def read_task_split(task: TaskConfig, split: Split) -> AnyDataset:
    """Read the ``train``, ``dev`` or ``test`` file of ``task`` with its format's reader (its
    type's :class:`~elmo_core.tasks.types.base.Format`)."""
    path = task.split_path(split)
    if path is None:
        raise ConfigError(f"task '{task.name}' has no {split} split", key=split)
    return task_type(task.type).read(task, path, split)


def task_labels(task: TaskConfig, train: AnyDataset | None = None) -> list[str]:
    """The task's label (or tag) list: ``task.labels`` if given, else those its type fixes (UD's
    relations), else the sorted labels of train.

    Pass the already-read ``train`` dataset to avoid reading it twice.
    """
    if task.labels is not None:
        return list(task.labels)
    known = task_type(task.type).known_labels(task)
    if known is not None:
        return known
    dataset = train if train is not None else read_task_split(task, "train")
    return dataset.labels()


def check_labels(dataset: AnyDataset, labels: list[str]) -> None:
    """Fail if ``dataset`` holds a label outside ``labels`` (e.g. a dev tag never seen in train)."""
    unknown = sorted(set(dataset.labels()) - set(labels))
    if unknown:
        raise DataError(
            f"labels not in the task's label set {labels}: {unknown}", path=dataset.path
        )
