"""What both pyfunc models do with a prediction request: read its token lists, check its params by
name, and hand our user errors to MLflow as its own, so that ``mlflow models serve`` answers 400
with our message instead of "unexpected error".

MLflow (3.17) enforces the model's signature before ``predict`` runs, served or in-process alike
(``PyFuncModel.predict``), which decides what can be checked here:

- ``dataframe_split``, ``dataframe_records`` and ``{"inputs": [{"sentence": ...}, ...]}`` give
  one row per record; ``{"inputs": {"sentence": ...}}`` is a *single* record (a signature with an
  array column makes a dict one row), so a list of sentences there arrives as one cell;
- columns the signature does not name are dropped, so a wrong column or a bare
  ``{"inputs": [...]}`` (whose only column is unnamed) reaches ``predict`` as no column at all;
- params the signature does not name are dropped as well, with only a logged warning. To refuse
  them anyway, :func:`watch_dropped_params` keeps the names from that warning for the prediction
  it belongs to, and :func:`checked_params` refuses them with the unknown names given directly.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc.context import Context, get_prediction_context
from mlflow.types.schema import ParamSpec

from elmo_core.errors import ConfigError, DataError, ElmoError
from elmo_core.text.tokenize import Tokenizer

DEFAULT_BATCH_SIZE = 64
BATCH_SIZE_SPEC = ParamSpec("batch_size", "long", DEFAULT_BATCH_SIZE)

# The warning of mlflow.models.utils._enforce_params_schema naming the params it drops.
_SCHEMA_LOGGER = "mlflow.models.utils"
_DROPPED_WARNING = re.compile(r"Unrecognized params (?P<names>\[.*\]) are ignored for inference")
# The params MLflow dropped last in this thread, with the prediction (its Context) they belong to.
_dropped: ContextVar[tuple[Context | None, tuple[str, ...]]] = ContextVar(
    "elmo_dropped_params", default=(None, ())
)


class _DroppedParams(logging.Filter):
    """Keeps the names in MLflow's "Unrecognized params" warning; lets the record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = _DROPPED_WARNING.search(record.getMessage())
        if found:
            _dropped.set((get_prediction_context(), _names(found["names"])))
        return True


def _names(listed: str) -> tuple[str, ...]:
    """``"['a', 'b']"`` → ``("a", "b")``; the text itself should MLflow ever print otherwise."""
    try:
        return tuple(str(name) for name in ast.literal_eval(listed))
    except (ValueError, SyntaxError):
        return (listed,)


def watch_dropped_params() -> None:
    """Let :func:`checked_params` see the params MLflow drops (once per process; at load time).

    MLflow makes the warning only while its logging level lets warnings through (the default);
    with ``MLFLOW_LOGGING_LEVEL=ERROR`` unknown params are dropped silently again.
    """
    logger = logging.getLogger(_SCHEMA_LOGGER)
    if not any(isinstance(existing, _DroppedParams) for existing in logger.filters):
        logger.addFilter(_DroppedParams())


def checked_params(params: Mapping[str, Any] | None, known: Collection[str]) -> dict[str, Any]:
    """``params`` as a dict, refusing every name not in ``known``: those given here and those MLflow
    dropped from this same prediction before calling ``predict``.

    A warning belongs to this prediction when it was logged under the same prediction context
    (``PyFuncModel.predict`` makes one per call), so the names of a call that MLflow failed
    after warning never leak into the next.
    """
    given = dict(params or {})
    context, dropped = _dropped.get()
    _dropped.set((None, ()))
    if context is None or context is not get_prediction_context():
        dropped = ()
    unknown = sorted((set(given) | set(dropped)) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown predict params {unknown}; this model takes {sorted(known)}",
            key=f"params.{unknown[0]}",
        )
    return given


def batch_size_param(params: Mapping[str, Any]) -> int:
    """The ``batch_size`` param (sentences per forward pass), positive."""
    batch_size = int(params.get(BATCH_SIZE_SPEC.name, DEFAULT_BATCH_SIZE))
    if batch_size < 1:
        raise ConfigError("batch_size must be positive", key="params.batch_size")
    return batch_size


@contextmanager
def mlflow_errors() -> Iterator[None]:
    """Our user errors re-raised as MLflow's INVALID_PARAMETER_VALUE: the scoring server answers
    400 with their message, where any other exception is a generic "unexpected error"."""
    try:
        yield
    except ElmoError as err:
        raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from err


def token_lists(
    frame: pd.DataFrame, tokens_column: str, text_column: str, tokenizer: Tokenizer
) -> list[list[str]]:
    """One token list per row: the tokens column when complete, else the text column tokenized.

    A row's text is one sequence: when the tokenizer finds several sentences in it, their tokens
    are concatenated (the biLM sees them as one sentence).
    """
    if tokens_column in frame.columns and frame[tokens_column].notna().all():
        return [_tokens(cell, tokens_column, row) for row, cell in enumerate(frame[tokens_column])]
    if text_column in frame.columns and frame[text_column].notna().all():
        return [
            _tokenized(cell, text_column, row, tokenizer)
            for row, cell in enumerate(frame[text_column])
        ]
    got = (
        f"got columns {list(frame.columns)}"
        if len(frame.columns)
        else "got none (MLflow drops columns the model does not name, and a bare list under "
        f'"inputs" has no names): send {_one_row_each(text_column)}'
    )
    raise DataError(
        f"input needs a '{text_column}' (text) or '{tokens_column}' (list of strings) column "
        f"with a value in every row; {got}"
    )


def _tokens(cell: Any, column: str, row: int) -> list[str]:
    if isinstance(cell, str):
        raise DataError(
            f"'{column}' holds a list of strings per row, but row {row} holds a string "
            "(raw text goes in the text column)"
        )
    return [str(token) for token in cell]


def _tokenized(cell: Any, column: str, row: int, tokenizer: Tokenizer) -> list[str]:
    if not isinstance(cell, str):
        raise DataError(
            f"'{column}' holds one text per row, but row {row} holds a value of type "
            f"{type(cell).__name__}: send {_one_row_each(column)}"
        )
    return [token for sentence in tokenizer.tokenize(cell) for token in sentence]


def _one_row_each(column: str) -> str:
    return (
        f'one row per sentence, as {{"inputs": [{{"{column}": "..."}}, ...]}}, '
        "dataframe_records or dataframe_split"
    )
