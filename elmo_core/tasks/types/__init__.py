"""The registered task types, by the name a task file's ``type`` gives: one line each."""

from __future__ import annotations

from elmo_core.tasks.types.base import TaskType
from elmo_core.tasks.types.classification import Classification
from elmo_core.tasks.types.pair import Pair
from elmo_core.tasks.types.parsing import Parsing
from elmo_core.tasks.types.tagging import Tagging

TASK_TYPES: dict[str, TaskType] = {
    kind.name: kind
    for kind in (
        Tagging(),
        Classification(),
        Pair(),
        Parsing(),
    )
}


def task_type(name: str) -> TaskType:
    """The registered type ``name`` (ValueError listing the registered types: a task file's
    ``type`` is checked with it as the file is read)."""
    if name not in TASK_TYPES:
        registered = ", ".join(TASK_TYPES)
        raise ValueError(f"unknown task type '{name}': the registered types are {registered}")
    return TASK_TYPES[name]
