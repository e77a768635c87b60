"""A downstream task declared in YAML: data files and format, reader options, head, training.

A new task needs no code, only a file such as ``examples/tasks/ner.yaml``, read through
:func:`~elmo_core.config.resolve_config` like every config; its paths are relative to the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from elmo_core.config import NestedError, StrictModel, parse_override, resolve_config

Batches = Literal["bucketed", "random"]  # how an epoch groups its examples
Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")


class HeadConfig(StrictModel):
    """The task model on top of the frozen biLM's scalar mix (Peters et al. 2018, §5)."""

    hidden_dim: int = Field(200, gt=0)
    num_layers: int = Field(1, ge=1)
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    crf: bool = Field(False, description="tagging: CRF output layer instead of per-token softmax")
    pooling: Literal["max", "mean"] = Field("max", description="classification: over time")
    pair_head: Literal["esim", "match"] = Field("esim", description="pair: ESIM or simple matching")
    elmo_at_output: bool = Field(False, description="also concatenate ELMo to the head's output")
    elmo_layer_norm: bool = Field(
        False, description="layer-normalise each biLM layer before the mix (paper §3.2)"
    )
    elmo_layers: list[int] | None = Field(
        None,
        min_length=1,
        description="the biLM layers the mix reads (0: the token layer); None: all of them",
    )

    @field_validator("elmo_layers")
    @classmethod
    def _layers_distinct(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (len(set(value)) != len(value) or min(value) < 0):
            raise ValueError("elmo_layers must be distinct layer numbers from 0")
        return value


class TaskTrainingConfig(StrictModel):
    """Adaptation run length and optimiser; ``patience`` dev scorings without improvement stop it,
    counted only once ``min_updates`` updates have run: a small training set scores 0 for its
    first epochs, and a score of 0 that stays 0 must not end the run before it learns. Dev is
    scored at an epoch's end once ``eval_every`` updates have run since the last scoring."""

    epochs: int = Field(10, gt=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(1e-3, gt=0.0)
    seed: int = 0
    patience: int | None = Field(3, gt=0, description="None: no early stopping")
    min_updates: int = Field(
        100, ge=0, description="optimizer updates before patience counts (early stopping)"
    )
    eval_every: int | None = Field(
        None, gt=0, description="updates between dev scorings (at epoch ends); None: every epoch"
    )
    batches: Batches = Field(
        "bucketed",
        description="bucketed: each batch of about one length, in a random order (AllenNLP's "
        "bucket iterator, which the paper's task models used); random: any examples together",
    )


class TaskConfig(StrictModel):
    """One downstream task: what to read, how to label it, the head and how to train it."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="names MLflow model elmo-<name>"
    )
    type: str = Field(description="a registered task type (elmo_core.tasks.types)")
    format: str = Field(description="a format the type reads")
    train: Path
    dev: Path | None = None
    test: Path | None = None
    reader: Any = Field(
        default_factory=dict,
        validate_default=True,
        description="the format's reader options: the model its type's Format names, e.g. "
        "tagging's Conll2003Options",
    )
    labels: list[str] | None = Field(
        None, min_length=1, description="fixed label order; None = the sorted labels of train"
    )
    head: HeadConfig = Field(default_factory=HeadConfig)
    training: TaskTrainingConfig = Field(default_factory=TaskTrainingConfig)

    @field_validator("type")
    @classmethod
    def _type_registered(cls, value: str) -> str:
        from elmo_core.tasks.types import task_type  # the types import this module

        task_type(value)  # ValueError listing the registered types
        return value

    @field_validator("format")
    @classmethod
    def _format_fits_type(cls, value: str, info: ValidationInfo) -> str:
        from elmo_core.tasks.types import TASK_TYPES

        declared = info.data.get("type")
        if declared in TASK_TYPES:
            TASK_TYPES[declared].format(value)  # ValueError naming the formats it reads
        return value

    @field_validator("reader", mode="before")
    @classmethod
    def _reader_options_of_format(cls, value: Any, info: ValidationInfo) -> Any:
        """The options as the format's model: an option of another format is refused, named."""
        from elmo_core.tasks.types import TASK_TYPES

        declared, format_name = info.data.get("type"), info.data.get("format")
        if declared not in TASK_TYPES or format_name is None:
            return value  # the type or format is refused already
        options = TASK_TYPES[declared].format(format_name).options
        try:
            return options.model_validate(value if value is not None else {})
        except ValidationError as err:
            first = err.errors()[0]
            message = f"{first['msg']} (reader option of format {format_name})"
            raise NestedError(message, first["loc"]) from None

    @field_validator("labels")
    @classmethod
    def _labels_unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("labels must be unique")
        return value

    @model_validator(mode="after")
    def _head_fits_type(self) -> TaskConfig:
        from elmo_core.tasks.types import task_type

        task_type(self.type).check(self)  # ValueError naming the option
        return self

    def split_path(self, split: Split) -> Path | None:
        """The file of ``split`` (None when the task has no such split)."""
        return {"train": self.train, "dev": self.dev, "test": self.test}[split]


def load_task_config(yaml_path: str | Path, overrides: Sequence[str] = ()) -> TaskConfig:
    """Load a task YAML (plus ``dotted.key=value`` overrides) and make its data paths absolute.

    Relative paths written in the YAML are resolved against the YAML file's directory, so a task
    directory can be moved as a whole; relative paths given as overrides are resolved against the
    current directory, where the user typed them. ``~`` is expanded in both.
    """
    yaml_path = Path(yaml_path)
    task = resolve_config(TaskConfig, None, yaml_path, overrides)
    from_override = {parse_override(text)[0] for text in overrides}
    resolved: dict[str, Path] = {}
    for split in SPLITS:
        path = task.split_path(split)
        if path is None:
            continue
        base = Path.cwd() if split in from_override else yaml_path.parent
        resolved[split] = (base / path.expanduser()).resolve()
    return task.model_copy(update=resolved)
