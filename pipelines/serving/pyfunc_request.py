"""What both pyfunc models do with a request: read its token lists, check its params by name, and
raise our user errors so that ``mlflow models serve`` answers 400 with our message.

MLflow drops unnamed columns and params before ``predict`` (params with only a warning), so a
missing column is reported here and the dropped params' names are refused.
"""

from __future__ import annotations

import ast
import logging
import os
import re
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
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
MAX_TOKENS_ENV = "ELMO_MAX_TOKENS_PER_SENTENCE"
MAX_ROWS_ENV = "ELMO_MAX_ROWS_PER_REQUEST"
# How much of MLflow's echo of the request a 400 keeps, after our message.
ECHO_CHARS = 200

# The warning of mlflow.models.utils._enforce_params_schema naming the params it drops.
_SCHEMA_LOGGER = "mlflow.models.utils"
_DROPPED_WARNING = re.compile(r"Unrecognized params (?P<names>\[.*\]) are ignored for inference")
# The params MLflow dropped last in this thread, with the prediction (its Context) they belong to.
_dropped: ContextVar[tuple[Context | None, tuple[str, ...]]] = ContextVar(
    "elmo_dropped_params", default=(None, ())
)


class _DroppedParams(logging.Filter):
    """Keeps the names in MLflow's "Unrecognized params" warning, and drops the warning: they
    are not ignored but refused, with a message naming them."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = _DROPPED_WARNING.search(record.getMessage())
        if found:
            _dropped.set((get_prediction_context(), _names(found["names"])))
        return not found


def _names(listed: str) -> tuple[str, ...]:
    """``"['a', 'b']"`` → ``("a", "b")``; the text itself should MLflow ever print otherwise."""
    try:
        return tuple(str(name) for name in ast.literal_eval(listed))
    except (ValueError, SyntaxError):
        return (listed,)


def watch_dropped_params() -> None:
    """Let :func:`checked_params` see the params MLflow drops (once per process; at load time).

    MLflow makes the warning only while its logging level lets warnings through (the default);
    with ``MLFLOW_LOGGING_LEVEL=ERROR`` unknown params are dropped silently again. The filter
    holds for the whole process: another model's dropped params go unwarned there too.
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


class RequestError(MlflowException):
    """A bad request: INVALID_PARAMETER_VALUE (400) whose message leads with what is wrong.

    The scoring server rewrites the message of every MlflowException from ``predict`` as
    ``Failed to predict data '<the whole request>'. \\nError: <message>`` (``invocations`` in
    ``mlflow/pyfunc/scoring_server``): the cause comes after an echo of any length. Set that way,
    the message keeps the cause first and the echo after it, cut to :data:`ECHO_CHARS`.
    """

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(cause, error_code=INVALID_PARAMETER_VALUE)

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, text: str) -> None:
        before, found, after = text.partition(self.cause)
        if not found:
            self._message = text
            return
        echo = " ".join(f"{before.rstrip().removesuffix('Error:')} {after}".split())
        cut = f"{echo[:ECHO_CHARS]}… (cut)" if len(echo) > ECHO_CHARS else echo
        self._message = f"{self.cause}\n{cut}" if cut else self.cause


@contextmanager
def mlflow_errors() -> Iterator[None]:
    """Our user errors re-raised as :class:`RequestError`: the scoring server answers 400 with
    their message, where any other exception is a generic "unexpected error"."""
    try:
        yield
    except ElmoError as err:
        raise RequestError(str(err)) from err


@dataclass(frozen=True)
class RequestLimits:
    """The most one ``predict`` call may ask: tokens in a sentence (in each side of a pair) and
    rows. Whoever runs the model sets them, through ``ELMO_MAX_TOKENS_PER_SENTENCE`` and
    ``ELMO_MAX_ROWS_PER_REQUEST`` (read at load); a request cannot, or it could lift them."""

    max_tokens: int = 512
    max_rows: int = 1000

    @classmethod
    def from_env(cls) -> RequestLimits:
        """The defaults, each replaced by its environment variable when set."""
        return cls(
            max_tokens=_positive_env(MAX_TOKENS_ENV, cls.max_tokens),
            max_rows=_positive_env(MAX_ROWS_ENV, cls.max_rows),
        )

    def check_rows(self, num_rows: int) -> None:
        if num_rows > self.max_rows:
            raise DataError(
                f"the request has {num_rows} rows, over the limit of {self.max_rows} per request "
                f"({MAX_ROWS_ENV} where the model runs): send them in several requests"
            )

    def check_tokens(self, tokens: list[str], column: str, row: int) -> list[str]:
        if len(tokens) > self.max_tokens:
            raise DataError(
                f"row {row}: '{column}' has {len(tokens)} tokens, over the limit of "
                f"{self.max_tokens} per sentence ({MAX_TOKENS_ENV} where the model runs)"
            )
        return tokens


def _positive_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdecimal() or int(value) < 1:
        raise ConfigError(
            f"must be a positive integer, not {value!r}", key=name, source="environment"
        )
    return int(value)


def token_lists(
    frame: pd.DataFrame,
    tokens_column: str,
    text_column: str,
    tokenizer: Tokenizer,
    limits: RequestLimits,
) -> list[list[str]]:
    """One token list per row: the tokens column when complete, else the text column tokenized;
    no more rows, nor tokens in a row, than ``limits`` allow. A row may have no tokens.

    A row's text is one sequence: when the tokenizer finds several sentences in it, their tokens
    are concatenated (the biLM sees them as one sentence).
    """
    limits.check_rows(len(frame))
    if tokens_column in frame.columns and frame[tokens_column].notna().all():
        column, cells = tokens_column, frame[tokens_column]
        rows = [_tokens(cell, column, row) for row, cell in enumerate(cells)]
    elif text_column in frame.columns and frame[text_column].notna().all():
        column, cells = text_column, frame[text_column]
        rows = [_tokenized(cell, column, row, tokenizer) for row, cell in enumerate(cells)]
    else:
        raise _no_column(frame, tokens_column, text_column)
    return [limits.check_tokens(tokens, column, row) for row, tokens in enumerate(rows)]


def _no_column(frame: pd.DataFrame, tokens_column: str, text_column: str) -> DataError:
    got = (
        f"got columns {list(frame.columns)}"
        if len(frame.columns)
        else "got none (MLflow drops columns the model does not name, and a bare list under "
        f'"inputs" has no names): send {_one_row_each(text_column)}'
    )
    return DataError(
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
