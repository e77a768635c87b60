"""What differs between task types, declared once: a :class:`TaskType` answers for its type
everywhere the code asks (reading, head, metrics, serving schema, error analysis, probes).

Code outside ``elmo_core/tasks/types`` never tests a type's name; it asks the task's type object
(:func:`elmo_core.tasks.types.task_type`). Adding a type is one module and one registry line
(docs/architecture.md, "Adding a task type").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from elmo_core.config import StrictModel
from elmo_core.tasks.dataset import TaskDataset
from elmo_core.tasks.heads import TaskHead
from elmo_core.tasks.metrics import SpanScores, confusion_matrix, label_scores

if TYPE_CHECKING:
    from elmo_core.tasks.task_config import HeadConfig, Split, TaskConfig

# The served model's column names, shared by every type's schema.
SENTENCE, TOKENS, LABEL, TAGS = "sentence", "tokens", "label", "tags"
COUNTS = ("num_gold", "num_predicted", "num_correct")
Prediction = list[str] | str  # what a model predicts for one example: tags, or a label
Table = dict[str, list[object]]


class NoOptions(StrictModel):
    """The ``reader`` options of a format that has none."""


@dataclass(frozen=True)
class Format:
    """A file format a type reads: its reader, and the model of the ``reader`` options a task
    file may give it (the reader is handed them validated)."""

    name: str
    read: Callable[[Path, Any, Split], TaskDataset[Any]]
    options: type[StrictModel] = NoOptions


@dataclass(frozen=True)
class Column:
    """One column of the served model's input or output: a string, or a list of strings or of
    integers."""

    name: str
    kind: Literal["string", "strings", "integers"]
    doc: str = ""


@dataclass(frozen=True)
class ErrorTables:
    """A closer look at one split's errors: scores per entity type or tag, or the confusion
    matrix of the labels (which the adapt run also draws)."""

    per_type: Table | None = None
    confusion: np.ndarray | None = None
    more: Mapping[str, Table] = field(default_factory=dict)  # by file name: a type's own


class TaskType(ABC):
    """One task type. Subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what a model of this type does, as the model card's first words
    formats: ClassVar[tuple[Format, ...]]
    head_options: ClassVar[tuple[str, ...]] = ()  # HeadConfig fields its head reads
    sides: ClassVar[tuple[str, ...]] = ()  # named sentence sides (pairs); () for one sentence
    probe: ClassVar[bool] = False  # the analysis trains its linear probe per layer on it

    # --- config and reading

    def format(self, name: str) -> Format:
        """The format ``name`` (ValueError naming those this type reads)."""
        for found in self.formats:
            if found.name == name:
                return found
        known = ", ".join(found.name for found in self.formats)
        raise ValueError(f"format '{name}' is not one a {self.name} task reads ({known})")

    def check(self, task: TaskConfig) -> None:
        """Refuse a head option that is not this type's (ValueError naming it)."""
        for option, default in (("crf", False),):
            if option not in self.head_options and getattr(task.head, option) != default:
                raise ValueError(f"head.{option} does not apply to a {self.name} task")

    def read(self, task: TaskConfig, path: Path, split: Split) -> TaskDataset[Any]:
        return self.format(task.format).read(path, task.reader, split)

    def known_labels(self, task: TaskConfig) -> list[str] | None:
        """The label set of every task of this type read so, where a standard fixes it (None:
        the task's ``labels``, else the sorted labels of its training split)."""
        return None

    def options_read(self, task: TaskConfig) -> tuple[str, ...]:
        """The ``head`` options this task's head reads (its params list no others)."""
        return self.head_options

    # --- model and scores

    @abstractmethod
    def head(
        self, input_dim: int, num_labels: int, config: HeadConfig, output_elmo_dim: int
    ) -> TaskHead:
        """The head over ``input_dim``-wide token vectors."""

    def main_metric(self, task: TaskConfig) -> str:
        """The score early stopping follows, and the registered version's headline and tags."""
        return "accuracy"

    def scores(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: np.ndarray,
        predicted: np.ndarray,
        offsets: np.ndarray,
    ) -> dict[str, float]:
        """Scores of predicted label ids against gold ones (per token or per example; the
        sentences at ``offsets`` where per token)."""
        if not len(gold):
            raise ValueError("accuracy of no items is undefined")
        return {"accuracy": float(np.mean(predicted == gold))}

    def token_labels(self, ids: Sequence[int], labels: Sequence[str]) -> list[str]:
        """Predicted ids of one sentence's tokens as strings (types labelled per token)."""
        return [labels[i] for i in ids]

    # --- examples

    @abstractmethod
    def gold(self, example: Any) -> Prediction:
        """What the model should predict for ``example``."""

    @abstractmethod
    def text_columns(self, example: Any) -> dict[str, str]:
        """``example`` as the served model's text input (tokens joined by spaces)."""

    # --- the served model

    def inputs(self) -> tuple[Column, ...]:
        """Text or tokens per side, each optional: a request sends one or the other."""
        if not self.sides:
            return (Column(SENTENCE, "string"), Column(TOKENS, "strings"))
        texts = tuple(Column(side, "string") for side in self.sides)
        return texts + tuple(Column(f"{side}_{TOKENS}", "strings") for side in self.sides)

    @abstractmethod
    def outputs(self) -> tuple[Column, ...]:
        """The served model's output columns."""

    @abstractmethod
    def output_rows(
        self, tokens: Sequence[list[str]], predictions: Sequence[Prediction | None]
    ) -> dict[str, list[Any]]:
        """Output columns of the rows read as ``tokens`` (the first side's), predicted as
        ``predictions``."""

    def no_prediction(self) -> Prediction | None:
        """The prediction of a row with no tokens (nothing to label)."""
        return None

    # --- error analysis

    def error_tables(
        self,
        task: TaskConfig,
        labels: Sequence[str],
        gold: Sequence[Prediction],
        predicted: Sequence[Prediction],
    ) -> ErrorTables:
        """The confusion matrix of the labels; types with finer scores override this."""
        return ErrorTables(confusion=confusion_matrix(gold, predicted, labels))


def per_label_table(per_type: Mapping[str, SpanScores]) -> Table:
    """Precision, recall, F1 and counts of each type or label, then ``(all)``: their sums."""
    total = SpanScores.from_counts(
        *(sum(getattr(s, count) for s in per_type.values()) for count in COUNTS)
    )
    rows = {**dict(sorted(per_type.items())), "(all)": total}
    table: Table = {"type": list(rows)}
    for column in ("precision", "recall", "f1", *COUNTS):
        table[column.removeprefix("num_")] = [getattr(scores, column) for scores in rows.values()]
    return table


def label_table(
    gold: Sequence[Prediction], predicted: Sequence[Prediction], labels: Sequence[str]
) -> Table:
    """:func:`per_label_table` of every label against the others."""
    return per_label_table(label_scores(confusion_matrix(gold, predicted, labels), labels))
