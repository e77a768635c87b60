"""A closer look at the ELMo task model's errors, logged as tables and a figure in its adapt run.

The model runs as users call it (biLM live, float32) while training scored float16 cached
activations, so an overall score may differ from the run's test metric in its last digits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import mlflow
import numpy as np
import torch

from elmo_core.tasks.dataset import Example
from elmo_core.tasks.readers import AnyDataset
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import TaskModel
from elmo_core.tasks.trainer import Prediction, predict
from elmo_core.tasks.types import task_type
from elmo_core.tasks.types.base import Table, TaskType
from pipelines.adapt.figures import confusion_figure
from pipelines.tracking.figures import log_figure

PER_TYPE_TABLE = "per_type_scores.json"
CONFUSION_TABLE = "confusion_matrix.json"
CONFUSION_FIGURE = "confusion_matrix.png"
SAMPLES_TABLE = "sample_predictions.json"
NUM_SAMPLES = 10


@dataclass(frozen=True)
class SplitPredictions:
    """One split's examples with their gold and predicted labels (tag lists, for tagging)."""

    split: str
    examples: list[Example]
    gold: list[Prediction]
    predicted: list[Prediction]


def evaluation_split(datasets: Mapping[str, AnyDataset]) -> str | None:
    """The split the analysis looks at: test, else dev; None when the task has neither."""
    return next((split for split in ("test", "dev") if split in datasets), None)


def predict_split(
    model: TaskModel, dataset: AnyDataset, split: str, bilm: torch.nn.Module
) -> SplitPredictions:
    """Label every example of ``dataset`` with the live biLM, as the registered model does."""
    examples: list[Example] = list(dataset.examples)
    kind = task_type(model.task.type)
    sides = [example.sides() for example in examples]
    if kind.sides:  # (premise, hypothesis) pairs
        predicted = predict(model, [(first, second) for first, second in sides], bilm)
    else:
        predicted = predict(model, [tokens for (tokens,) in sides], bilm)
    gold: list[Prediction] = [kind.gold(example) for example in examples]
    return SplitPredictions(split, examples, gold, predicted)


def log_error_analysis(task: TaskConfig, labels: Sequence[str], found: SplitPredictions) -> None:
    """Log the tables (and figure) the task's type gives, and the sample predictions."""
    kind = task_type(task.type)
    tables = kind.error_tables(task, labels, found.gold, found.predicted)
    if tables.per_type is not None:
        mlflow.log_table(tables.per_type, PER_TYPE_TABLE)
    if tables.confusion is not None:
        mlflow.log_table(confusion_table(tables.confusion, labels), CONFUSION_TABLE)
        title = f"{task.name}: {found.split} confusion matrix (ELMo)"
        log_figure(confusion_figure(tables.confusion, labels, title), CONFUSION_FIGURE)
    for name, table in tables.more.items():
        mlflow.log_table(table, name)
    mlflow.log_table(sample_table(found, kind), SAMPLES_TABLE)


def confusion_table(matrix: np.ndarray, labels: Sequence[str]) -> Table:
    """The matrix as a table: a row per gold label, a ``predicted <label>`` column per label."""
    table: Table = {"gold": list(labels)}
    for column, label in enumerate(labels):
        table[f"predicted {label}"] = matrix[:, column].tolist()
    return table


def sample_table(found: SplitPredictions, kind: TaskType, size: int = NUM_SAMPLES) -> Table:
    """``size`` examples in the model's input columns with gold and predicted labels (tags
    joined by spaces) and whether they match: half of them errors and half right where the split
    has enough of each, the errors first, each group in file order."""
    right = [i for i in range(len(found.examples)) if found.gold[i] == found.predicted[i]]
    wrong = [i for i in range(len(found.examples)) if found.gold[i] != found.predicted[i]]
    errors = wrong[: max(size // 2, size - len(right))]
    order = errors + right[: size - len(errors)]
    rows = [
        {
            **kind.text_columns(found.examples[i]),
            "gold": _text(found.gold[i]),
            "predicted": _text(found.predicted[i]),
            "correct": found.gold[i] == found.predicted[i],
        }
        for i in order[:size]
    ]
    return {column: [row[column] for row in rows] for column in (rows[0] if rows else {})}


def _text(label: Prediction) -> str:
    return label if isinstance(label, str) else " ".join(label)
