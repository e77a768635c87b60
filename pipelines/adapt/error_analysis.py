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

from elmo_core.tasks.dataset import PairExample, TaggingExample
from elmo_core.tasks.metrics import SpanScores, confusion_matrix, label_scores, span_f1
from elmo_core.tasks.readers import AnyDataset
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import Example, TaskModel
from elmo_core.tasks.trainer import Prediction, main_metric, predict
from pipelines.adapt.figures import confusion_figure
from pipelines.adapt.task_records import input_columns
from pipelines.tracking.figures import log_figure

PER_TYPE_TABLE = "per_type_scores.json"
CONFUSION_TABLE = "confusion_matrix.json"
CONFUSION_FIGURE = "confusion_matrix.png"
SAMPLES_TABLE = "sample_predictions.json"
NUM_SAMPLES = 10
COUNTS = ("num_gold", "num_predicted", "num_correct")
Table = dict[str, list[object]]


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
    pairs = [(e.premise, e.hypothesis) for e in examples if isinstance(e, PairExample)]
    singles = [e.tokens for e in examples if not isinstance(e, PairExample)]
    predicted = predict(model, pairs, bilm) if pairs else predict(model, singles, bilm)
    gold: list[Prediction] = [
        list(example.tags) if isinstance(example, TaggingExample) else example.label
        for example in examples
    ]
    return SplitPredictions(split, examples, gold, predicted)


def log_error_analysis(task: TaskConfig, labels: Sequence[str], found: SplitPredictions) -> None:
    """Log the tables (and figure) the module docstring lists for the task's type."""
    if task.type == "tagging":
        mlflow.log_table(per_type_table(task, labels, found), PER_TYPE_TABLE)
    else:
        matrix = confusion_matrix(found.gold, found.predicted, labels)
        mlflow.log_table(confusion_table(matrix, labels), CONFUSION_TABLE)
        title = f"{task.name}: {found.split} confusion matrix (ELMo)"
        log_figure(confusion_figure(matrix, labels, title), CONFUSION_FIGURE)
    mlflow.log_table(sample_table(found), SAMPLES_TABLE)


def per_type_table(task: TaskConfig, labels: Sequence[str], found: SplitPredictions) -> Table:
    """Precision, recall, F1 and counts per entity type (IOB tags) or per tag, then ``(all)``."""
    scheme = task.reader.tag_scheme
    if main_metric(task) == "f1" and scheme != "none":
        spans = span_f1(_tag_lists(found.gold), _tag_lists(found.predicted), scheme)
        per_type: Mapping[str, SpanScores] = spans.per_type
        total: SpanScores = spans
    else:
        per_type = label_scores(confusion_matrix(found.gold, found.predicted, labels), labels)
        total = SpanScores.from_counts(
            *(sum(getattr(s, count) for s in per_type.values()) for count in COUNTS)
        )
    rows = [*sorted(per_type.items()), ("(all)", total)]
    table: Table = {"type": [name for name, _ in rows]}
    for column in ("precision", "recall", "f1", *COUNTS):
        table[column.removeprefix("num_")] = [getattr(scores, column) for _, scores in rows]
    return table


def confusion_table(matrix: np.ndarray, labels: Sequence[str]) -> Table:
    """The matrix as a table: a row per gold label, a ``predicted <label>`` column per label."""
    table: Table = {"gold": list(labels)}
    for column, label in enumerate(labels):
        table[f"predicted {label}"] = matrix[:, column].tolist()
    return table


def sample_table(found: SplitPredictions, size: int = NUM_SAMPLES) -> Table:
    """``size`` examples in the model's input columns with gold and predicted labels (tags
    joined by spaces) and whether they match: half of them errors and half right where the split
    has enough of each, the errors first, each group in file order."""
    right = [i for i in range(len(found.examples)) if found.gold[i] == found.predicted[i]]
    wrong = [i for i in range(len(found.examples)) if found.gold[i] != found.predicted[i]]
    errors = wrong[: max(size // 2, size - len(right))]
    order = errors + right[: size - len(errors)]
    rows = [
        {
            **input_columns(found.examples[i]),
            "gold": _text(found.gold[i]),
            "predicted": _text(found.predicted[i]),
            "correct": found.gold[i] == found.predicted[i],
        }
        for i in order[:size]
    ]
    return {column: [row[column] for row in rows] for column in (rows[0] if rows else {})}


def _tag_lists(labels: Sequence[Prediction]) -> list[list[str]]:
    return [list(tags) for tags in labels]


def _text(label: Prediction) -> str:
    return label if isinstance(label, str) else " ".join(label)
