"""A task's data as adapt and analyze read it: splits checked against one label set, with the frozen
biLM's activations from the cache.

Both stages share one activation cache, so a task adapted once is analysed without another pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from elmo_core.errors import ConfigError, DataError
from elmo_core.location import sha256_file
from elmo_core.tasks import read_task_split
from elmo_core.tasks.activation_cache import ActivationCache
from elmo_core.tasks.readers import AnyDataset, check_labels, task_labels
from elmo_core.tasks.task_config import SPLITS, TaskConfig
from elmo_core.tasks.task_model import example_sentences
from elmo_core.tasks.trainer import TaskSplit


def check_tasks(tasks: Sequence[TaskConfig]) -> None:
    """No tasks, two tasks registering one model name, or a missing data file: refuse now."""
    if not tasks:
        raise ConfigError("no task given", key="tasks")
    names = [task.name for task in tasks]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"two tasks named {duplicates[0]} would register one model", key="name")
    for task in tasks:
        for split in SPLITS:
            path = task.split_path(split)
            if path is not None and not path.is_file():
                raise DataError(f"{task.name}: {split} file not found", path=path)


def task_inputs(task: TaskConfig) -> dict[str, Any]:
    """What a task's results depend on, for a reuse key: its config, each data file named by its
    sha256 instead of its path (a moved file holds the same data; an edited one does not)."""
    files = {split: sha256_file(path) for split in SPLITS if (path := task.split_path(split))}
    return task.model_dump(mode="json", exclude={"train", "dev", "test"}) | {"files": files}


def read_splits(task: TaskConfig) -> dict[str, AnyDataset]:
    """The task's splits that exist, with dev/test labels checked against train's label set."""
    datasets: dict[str, AnyDataset] = {
        name: read_task_split(task, name) for name in SPLITS if task.split_path(name)
    }
    labels = task_labels(task, datasets["train"])
    for dataset in datasets.values():
        check_labels(dataset, labels)
    return datasets


def cache_splits(
    bilm: torch.nn.Module, datasets: Mapping[str, AnyDataset], cache_dir: str | Path
) -> dict[str, TaskSplit]:
    """Each split with the frozen biLM's activations, from the cache (built on first use)."""
    cache = ActivationCache(cache_dir)
    return {
        name: TaskSplit(
            dataset,
            cache.get_or_build(bilm, example_sentences(list(dataset.examples)), progress=False),
        )
        for name, dataset in datasets.items()
    }
