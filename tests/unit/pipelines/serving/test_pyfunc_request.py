"""pyfunc_request: token lists from a request's columns within the limits, params checked by name
(also those MLflow drops), user errors handed to MLflow as INVALID_PARAMETER_VALUE, cause first."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import mlflow
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.pyfunc import PyFuncModel, PythonModel, PythonModelContext
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from elmo_core.errors import ConfigError, DataError
from elmo_core.text.tokenize import MosesTokenizer
from pipelines.serving.pyfunc_request import (
    ECHO_CHARS,
    MAX_ROWS_ENV,
    MAX_TOKENS_ENV,
    RequestError,
    RequestLimits,
    batch_size_param,
    checked_params,
    mlflow_errors,
    token_lists,
    watch_dropped_params,
)

TOKENIZER = MosesTokenizer()
LIMITS = RequestLimits()


class _ParamsEcho(PythonModel):
    """The smallest pyfunc model that checks its params as ours do: returns the ones it got."""

    def load_context(self, context: PythonModelContext) -> None:
        watch_dropped_params()

    def predict(
        self,
        context: PythonModelContext | None,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> list[str]:
        with mlflow_errors():
            return sorted(checked_params(params, ["size"]))


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> PyFuncModel:
    path = tmp_path_factory.mktemp("echo") / "model"
    signature = ModelSignature(
        inputs=Schema([ColSpec("string", "sentence")]),
        params=ParamSchema([ParamSpec("size", "long", 1)]),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")
        mlflow.pyfunc.save_model(
            path, python_model=_ParamsEcho(), signature=signature, pip_requirements=[]
        )
    return mlflow.pyfunc.load_model(str(path))


def test_params_mlflow_drops_are_refused_by_name(echo: PyFuncModel) -> None:
    frame = pd.DataFrame({"sentence": ["hi"]})
    assert echo.predict(frame, params={"size": 2}) == ["size"]
    with pytest.raises(MlflowException, match=r"unknown predict params \['sizes'\]") as caught:
        echo.predict(frame, params={"sizes": 2})
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"


def test_dropped_params_of_a_prediction_mlflow_failed_do_not_leak_into_the_next(
    echo: PyFuncModel,
) -> None:
    frame = pd.DataFrame({"sentence": ["hi"]})
    with pytest.raises(MlflowException, match="Invalid parameters found"):
        echo.predict(frame, params={"sizes": 2, "size": "many"})  # dropped, then MLflow fails
    assert echo.predict(frame) == ["size"]


def test_refused_params_are_not_also_logged_as_ignored(echo: PyFuncModel) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("mlflow.models.utils")
    logger.addHandler(handler)
    try:
        with pytest.raises(MlflowException, match="unknown predict params"):
            echo.predict(pd.DataFrame({"sentence": ["hi"]}), params={"sizes": 2})
    finally:
        logger.removeHandler(handler)
    assert not [record for record in records if "Unrecognized params" in record.getMessage()]


def test_unknown_params_given_directly_name_their_key_and_the_known_ones() -> None:
    assert checked_params(None, ["a"]) == {}
    with pytest.raises(ConfigError, match=r"takes \['a', 'b'\]") as caught:
        checked_params({"a": 1, "c": 2}, ["b", "a"])
    assert caught.value.key == "params.c"


def test_batch_size_defaults_to_64_and_must_be_positive() -> None:
    assert batch_size_param({}) == 64
    assert batch_size_param({"batch_size": 3}) == 3
    with pytest.raises(ConfigError) as caught:
        batch_size_param({"batch_size": 0})
    assert caught.value.key == "params.batch_size"


def test_user_errors_become_invalid_parameter_value_with_their_message() -> None:
    with pytest.raises(MlflowException) as caught, mlflow_errors():
        raise DataError("no such column", path="input")
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert caught.value.message == "input: no such column"
    assert isinstance(caught.value, RequestError)
    assert isinstance(caught.value.__cause__, DataError)
    with pytest.raises(RuntimeError), mlflow_errors():  # a bug stays a bug
        raise RuntimeError("not the user's")


def test_mlflows_echo_of_the_request_comes_after_the_cause_and_is_cut() -> None:
    error = RequestError("row 0: too long")
    request = "[{'sentence': np.str_('" + "word " * 1000 + "')}]"
    # What mlflow.pyfunc.scoring_server.invocations does to every MlflowException of predict:
    error.message = f"Failed to predict data '{request}'. \nError: {error.message}"
    cause, echo = error.message.split("\n")
    assert cause == "row 0: too long"
    assert echo.startswith("Failed to predict data '[{'sentence': np.str_('word word")
    assert echo.endswith("… (cut)") and len(echo) == ECHO_CHARS + len("… (cut)")
    short = RequestError("bad")
    short.message = "Failed to predict data '[]'. \nError: bad"
    assert short.message == "bad\nFailed to predict data '[]'."
    assert short.error_code == "INVALID_PARAMETER_VALUE" and str(short) == "bad"


def test_limits_default_to_512_tokens_and_1000_rows_and_are_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MAX_TOKENS_ENV, raising=False)
    monkeypatch.delenv(MAX_ROWS_ENV, raising=False)
    assert RequestLimits.from_env() == RequestLimits(max_tokens=512, max_rows=1000)
    monkeypatch.setenv(MAX_ROWS_ENV, "20")
    assert RequestLimits.from_env() == RequestLimits(max_tokens=512, max_rows=20)
    monkeypatch.setenv(MAX_TOKENS_ENV, "lots")
    with pytest.raises(ConfigError, match="must be a positive integer, not 'lots'") as caught:
        RequestLimits.from_env()
    assert caught.value.key == MAX_TOKENS_ENV


def test_a_row_over_the_token_limit_is_refused_naming_the_row_and_the_limit() -> None:
    limits = RequestLimits(max_tokens=3, max_rows=1000)
    frame = pd.DataFrame({"text": ["Hi there!", "One two three four."]})
    with pytest.raises(DataError, match=r"row 1: 'text' has 5 tokens, over the limit of 3 per"):
        token_lists(frame, "words", "text", TOKENIZER, limits)
    assert token_lists(frame[:1], "words", "text", TOKENIZER, limits) == [["Hi", "there", "!"]]


def test_a_request_over_the_row_limit_is_refused_before_it_is_read() -> None:
    limits = RequestLimits(max_tokens=512, max_rows=2)
    frame = pd.DataFrame({"other": ["a", "b", "c"]})  # no input column: the rows fail first
    with pytest.raises(
        DataError, match=f"3 rows, over the limit of 2 per request \\({MAX_ROWS_ENV}"
    ):
        token_lists(frame, "words", "text", TOKENIZER, limits)


def test_empty_rows_give_empty_token_lists() -> None:
    frame = pd.DataFrame({"text": ["", "  ", "Hi"]})
    assert token_lists(frame, "words", "text", TOKENIZER, LIMITS) == [[], [], ["Hi"]]
    assert token_lists(pd.DataFrame({"words": [[]]}), "words", "text", TOKENIZER, LIMITS) == [[]]


def test_complete_tokens_column_wins_else_the_text_is_tokenized() -> None:
    both = pd.DataFrame({"text": ["Hi there!"], "words": [["Hi", "there"]]})
    assert token_lists(both, "words", "text", TOKENIZER, LIMITS) == [["Hi", "there"]]
    partial = pd.DataFrame({"text": ["Hi there!", "Yes."], "words": [["Hi"], None]})
    assert token_lists(partial, "words", "text", TOKENIZER, LIMITS) == [
        ["Hi", "there", "!"],
        ["Yes", "."],
    ]


def test_no_input_column_is_a_data_error_saying_how_to_send_sentences() -> None:
    with pytest.raises(DataError, match=r"got columns \['other'\]"):
        token_lists(pd.DataFrame({"other": ["x"]}), "words", "text", TOKENIZER, LIMITS)
    with pytest.raises(DataError, match='bare list under "inputs"') as caught:
        token_lists(pd.DataFrame(), "words", "text", TOKENIZER, LIMITS)
    assert '{"inputs": [{"text": "..."}, ...]}' in str(caught.value)


def test_a_list_in_the_text_column_is_refused_as_one_row_per_sentence() -> None:
    # What MLflow makes of {"inputs": {"text": ["a", "b"]}}: one row holding the list.
    frame = pd.DataFrame({"text": [["First one.", "Second one."]]})
    with pytest.raises(DataError, match="'text' holds one text per row, but row 0 holds"):
        token_lists(frame, "words", "text", TOKENIZER, LIMITS)


def test_a_string_in_the_tokens_column_is_refused_not_spelt_out() -> None:
    with pytest.raises(DataError, match="row 0 holds a string"):
        token_lists(pd.DataFrame({"words": ["Hi there"]}), "words", "text", TOKENIZER, LIMITS)


def test_watching_twice_adds_one_filter() -> None:
    watch_dropped_params()
    watch_dropped_params()
    filters = logging.getLogger("mlflow.models.utils").filters
    assert sum(type(f).__name__ == "_DroppedParams" for f in filters) == 1
