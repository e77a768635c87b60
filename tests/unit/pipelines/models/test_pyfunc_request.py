"""pyfunc_request: token lists from a request's columns, params checked by name (also those MLflow
drops), user errors handed to MLflow as INVALID_PARAMETER_VALUE."""

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
from pipelines.models.pyfunc_request import (
    batch_size_param,
    checked_params,
    mlflow_errors,
    token_lists,
    watch_dropped_params,
)

TOKENIZER = MosesTokenizer()


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
    assert isinstance(caught.value.__cause__, DataError)
    with pytest.raises(RuntimeError), mlflow_errors():  # a bug stays a bug
        raise RuntimeError("not the user's")


def test_complete_tokens_column_wins_else_the_text_is_tokenized() -> None:
    both = pd.DataFrame({"text": ["Hi there!"], "words": [["Hi", "there"]]})
    assert token_lists(both, "words", "text", TOKENIZER) == [["Hi", "there"]]
    partial = pd.DataFrame({"text": ["Hi there!", "Yes."], "words": [["Hi"], None]})
    assert token_lists(partial, "words", "text", TOKENIZER) == [["Hi", "there", "!"], ["Yes", "."]]


def test_no_input_column_is_a_data_error_saying_how_to_send_sentences() -> None:
    with pytest.raises(DataError, match=r"got columns \['other'\]"):
        token_lists(pd.DataFrame({"other": ["x"]}), "words", "text", TOKENIZER)
    with pytest.raises(DataError, match='bare list under "inputs"') as caught:
        token_lists(pd.DataFrame(), "words", "text", TOKENIZER)
    assert '{"inputs": [{"text": "..."}, ...]}' in str(caught.value)


def test_a_list_in_the_text_column_is_refused_as_one_row_per_sentence() -> None:
    # What MLflow makes of {"inputs": {"text": ["a", "b"]}}: one row holding the list.
    frame = pd.DataFrame({"text": [["First one.", "Second one."]]})
    with pytest.raises(DataError, match="'text' holds one text per row, but row 0 holds"):
        token_lists(frame, "words", "text", TOKENIZER)


def test_a_string_in_the_tokens_column_is_refused_not_spelt_out() -> None:
    with pytest.raises(DataError, match="row 0 holds a string"):
        token_lists(pd.DataFrame({"words": ["Hi there"]}), "words", "text", TOKENIZER)


def test_watching_twice_adds_one_filter() -> None:
    watch_dropped_params()
    watch_dropped_params()
    filters = logging.getLogger("mlflow.models.utils").filters
    assert sum(type(f).__name__ == "_DroppedParams" for f in filters) == 1
