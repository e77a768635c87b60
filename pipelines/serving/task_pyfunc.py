"""An adapted task model as an MLflow pyfunc model: raw sentences in, labels or tags out.

Like :mod:`pipelines.serving.bilm_pyfunc` this file is the model's code file, so nothing is
unpickled; the frozen biLM runs live, as the activation cache ran it in training.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, cast

import mlflow
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel, PythonModelContext
from mlflow.types.schema import Array, ColSpec, ParamSchema, Schema, TensorSpec

from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import TaskModel
from elmo_core.tasks.trainer import Prediction, predict
from elmo_core.tasks.types import task_type
from elmo_core.tasks.types.base import SENTENCE, TOKENS, Column
from elmo_core.text.tokenize import MosesTokenizer, Tokenizer
from pipelines.serving.bilm_loader import BILM_ARTIFACT, load_bilm, resolve_bilm
from pipelines.serving.pyfunc_request import (
    BATCH_SIZE_SPEC,
    RequestLimits,
    batch_size_param,
    checked_params,
    mlflow_errors,
    token_lists,
    watch_dropped_params,
)

TASK_ARTIFACT = "task_model"
WEIGHTS_FILE = "model.pt"
DESCRIPTION_FILE = "task_model.json"

Rows = list[list[str]] | list[tuple[list[str], list[str]]]


def save_task_model(
    model: TaskModel, directory: str | Path, tokenizer: dict[str, Any] | None = None
) -> Path:
    """Write the weights and everything needed to rebuild ``model`` (no pickled classes)."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    description = {
        "task": model.task.model_dump(mode="json"),
        "vocab": model.vocab,
        "labels": model.labels,
        "use_elmo": model.use_elmo,
        "num_layers": model.num_layers,
        "layer_dim": model.layer_dim,
        "word_dim": model.word_embedding.embedding_dim,
        "tokenizer": tokenizer,
    }
    (target / DESCRIPTION_FILE).write_text(json.dumps(description), encoding="utf-8")
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    torch.save(state, target / WEIGHTS_FILE)
    return target


def load_task_model(directory: str | Path) -> tuple[TaskModel, dict[str, Any] | None]:
    """The model saved by :func:`save_task_model` (eval mode) and its tokenizer description."""
    source = Path(directory)
    try:
        description = json.loads((source / DESCRIPTION_FILE).read_text(encoding="utf-8"))
        model = TaskModel(
            _saved_task(description["task"]),
            description["num_layers"],
            description["layer_dim"],
            description["vocab"],
            description["labels"],
            description["use_elmo"],
            word_dim=description["word_dim"],
        )
        state = torch.load(source / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise WeightsError(f"not a saved task model: {err}", path=source) from None
    return model.eval(), description["tokenizer"]


def _saved_task(saved: dict[str, Any]) -> TaskConfig:
    """A saved task config; one saved before each format had reader options of its own holds
    every format's, of which its format's are kept."""
    options = task_type(saved["type"]).format(saved["format"]).options.model_fields
    reader = {key: value for key, value in saved.get("reader", {}).items() if key in options}
    return TaskConfig.model_validate({**saved, "reader": reader})


def model_signature(type_name: str) -> ModelSignature:
    """The type's columns: optional text or tokens in (one of each per side), predictions out;
    ``batch_size`` as the one param."""
    kind = task_type(type_name)
    inputs: list[ColSpec | TensorSpec] = [_spec(c, required=False) for c in kind.inputs()]
    outputs: list[ColSpec | TensorSpec] = [_spec(column) for column in kind.outputs()]
    return ModelSignature(
        inputs=Schema(inputs), outputs=Schema(outputs), params=ParamSchema([BATCH_SIZE_SPEC])
    )


def _spec(column: Column, required: bool = True) -> ColSpec:
    kinds: dict[str, Array | str] = {
        "string": "string",
        "strings": Array("string"),
        "integers": Array("long"),
    }
    return ColSpec(kinds[column.kind], column.name, required=required)


class TaskPredictor(PythonModel):
    """Tokenizes, runs the frozen biLM live, applies the trained scalar mix and head."""

    def __init__(self) -> None:
        self._model: TaskModel | None = None
        self._bilm: BiLM | None = None
        self._tokenizer: Tokenizer = MosesTokenizer()
        self._limits = RequestLimits()

    def load_context(self, context: PythonModelContext) -> None:
        watch_dropped_params()
        self.load(context.artifacts[TASK_ARTIFACT], context.artifacts[BILM_ARTIFACT])

    def load(self, task_dir: str | Path, bilm_dir: str | Path) -> None:
        """Load the task model, the biLM and the request limits (what ``load_context`` does)."""
        self._limits = RequestLimits.from_env()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = load_task_model(task_dir)
        self._model = model.to(device)
        self._bilm = load_bilm(resolve_bilm(bilm_dir)).bilm.to(device)
        if tokenizer is not None:
            self._tokenizer = Tokenizer.from_manifest(tokenizer)

    @property
    def model(self) -> TaskModel:
        if self._model is None:
            raise RuntimeError("TaskPredictor used before load_context")
        return self._model

    def predict(
        self,
        context: PythonModelContext | None,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        """One output row per input row: the tokens read and their label or tags.

        A bad input or param is an MlflowException (INVALID_PARAMETER_VALUE) saying what is wrong.
        """
        kind = task_type(self.model.task.type)
        with mlflow_errors():
            batch_size = batch_size_param(checked_params(params, [BATCH_SIZE_SPEC.name]))
            sides = [self._column(model_input, side) for side in kind.sides or (None,)]
            rows = cast(Rows, sides[0] if len(sides) == 1 else list(zip(*sides, strict=True)))
            complete = [all(side[i] for side in sides) for i in range(len(sides[0]))]
            columns = kind.output_rows(sides[0], self._predict(rows, complete, batch_size))
        # object columns: pandas would store the None label of a string column as NaN
        return pd.DataFrame(columns, dtype=object)

    def _predict(
        self, rows: Rows, has_tokens: list[bool], batch_size: int
    ) -> list[Prediction | None]:
        """The model's predictions of the rows with tokens; for the others no tags, or no label:
        an empty sentence has nothing to label (and the model cannot pack a batch of them)."""
        kept = cast(Rows, [row for row, full in zip(rows, has_tokens, strict=True) if full])
        predicted = iter(predict(self.model, kept, self._bilm, batch_size))
        none = task_type(self.model.task.type).no_prediction()
        return [next(predicted) if full else none for full in has_tokens]

    def _column(self, frame: pd.DataFrame, side: str | None) -> list[list[str]]:
        """Token lists of one input: its tokens column if complete, else its text tokenized."""
        tokens = f"{side}_{TOKENS}" if side else TOKENS
        return token_lists(frame, tokens, side or SENTENCE, self._tokenizer, self._limits)


if __name__ != "pipelines.serving.task_pyfunc":
    # MLflow runs this file as the model's code: serve the installed package's class.
    installed = importlib.import_module("pipelines.serving.task_pyfunc")
    mlflow.models.set_model(installed.TaskPredictor())
