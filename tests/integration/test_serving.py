"""``mlflow models serve`` of a registered biLM, as the README's "Serving a model" shows it: the
documented requests answer 200, empty sentences too, bad ones 400 with a message that leads with
what is wrong, and the server's log stays quiet. Task models read requests and report errors
through the same code (:mod:`pipelines.serving.pyfunc_request`); their own handling of empty rows
is tested in process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.tokenize import MosesTokenizer
from pipelines.registry.policy import promote
from pipelines.registry.register import DatasetFiles, register_bilm
from pipelines.serving.bilm_loader import LoadedBiLM
from pipelines.serving.pyfunc_request import MAX_ROWS_ENV, MAX_TOKENS_ENV
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

MODEL_URI = "models:/elmo-bilm@champion"
NUM_LAYERS, WIDTH = 3, 32  # tiny(): token layer + 2 LSTM layers, 2 × projection 16
START_TIMEOUT_S = 60
JOHN = "John lives in Berlin."
JOHN_TOKENS = ["John", "lives", "in", "Berlin", "."]
# The limits' defaults (pipelines.serving.pyfunc_request.RequestLimits), which the server keeps.
MAX_TOKENS, MAX_ROWS = 512, 1000


@dataclass(frozen=True)
class Server:
    url: str
    log: Path


def _register_champion(root: Path) -> None:
    """A tiny biLM as ``elmo-bilm@champion``; its manifest names only the tokenizer (Moses)."""
    torch.manual_seed(0)
    bilm = BiLM(tiny(), 100)
    manifest = root / "manifest.json"
    manifest.write_text(json.dumps({"tokenizer": MosesTokenizer().describe()}))
    files = DatasetFiles(
        url=str(root),
        vocab=None,
        manifest=manifest,
        vocab_sha256=None,
        manifest_sha256=hashlib.sha256(manifest.read_bytes()).hexdigest(),
    )
    loaded = LoadedBiLM(bilm, write_bilm_dir(bilm, root / "bilm"))
    registered = register_bilm(loaded, files, evaluation=None, hdf5_export=False)
    promote(registered.name, registered.version)


def _wait_for_ping(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet
            time.sleep(0.25)
    pytest.fail(f"no /ping within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen[bytes]) -> None:
    """End the CLI and the uvicorn it started: the whole process group."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    isolated_home: Callable[[Path], AbstractContextManager[None]],
    free_port: Callable[[], int],
) -> Iterator[Server]:
    """``mlflow models serve -m models:/elmo-bilm@champion --env-manager local`` with the README's
    environment (its own process group, killed whole at teardown): its URL and its log."""
    root = tmp_path_factory.mktemp("serving")
    with isolated_home(root):
        _register_champion(root)
        port = free_port()
        venv_bin = str(Path(sys.executable).parent)  # uvicorn, which the CLI runs by name
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": stage_runs.use_tracking(),
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        }
        for limit in (MAX_TOKENS_ENV, MAX_ROWS_ENV):
            env.pop(limit, None)
        command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", MODEL_URI]
        command += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
        log = root / "serve.log"
        with log.open("wb") as output:
            server = subprocess.Popen(
                command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for_ping(url, server, log)
            yield Server(url, log)
        finally:
            _stop(server)


def _invoke(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` to /invocations: the status and the decoded answer."""
    request = urllib.request.Request(
        f"{server.url}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _shapes(answer: Any) -> list[tuple[int, ...]]:
    return [np.asarray(row["embeddings"]).shape for row in answer["predictions"]]


def test_dataframe_split_of_sentences_answers_every_layer_of_every_token(served: Server) -> None:
    body = {"dataframe_split": {"columns": ["sentence"], "data": [[JOHN], ["Hi!"]]}}
    status, answer = _invoke(served, body)
    assert status == 200
    assert [row["tokens"] for row in answer["predictions"]] == [JOHN_TOKENS, ["Hi", "!"]]
    assert _shapes(answer) == [(NUM_LAYERS, 5, WIDTH), (NUM_LAYERS, 2, WIDTH)]


def test_served_vectors_equal_the_in_process_ones(served: Server) -> None:
    status, answer = _invoke(served, {"dataframe_records": [{"sentence": JOHN}]})
    assert status == 200
    local = mlflow.pyfunc.load_model(MODEL_URI).predict(pd.DataFrame({"sentence": [JOHN]}))
    np.testing.assert_allclose(
        np.asarray(answer["predictions"][0]["embeddings"]),
        np.asarray(local["embeddings"][0]),
        rtol=1e-5,
        atol=1e-6,  # the server's torch runs on more threads than the tests' one
    )


def test_records_of_tokens_with_params_answer_one_mixed_vector_per_sentence(served: Server) -> None:
    body = {
        "dataframe_records": [{"tokens": ["John", "lives"]}, {"tokens": ["Hi"]}],
        "params": {"output": "mix", "weights": [0.5, 0.25, 0.25], "mean_pool": True},
    }
    status, answer = _invoke(served, body)
    assert status == 200
    assert _shapes(answer) == [(WIDTH,), (WIDTH,)]


def test_inputs_as_a_list_of_records_answer_one_row_each(served: Server) -> None:
    body = {
        "inputs": [{"sentence": JOHN}, {"sentence": "Hi!"}],
        "params": {"output": "layer", "layer": -1},
    }
    status, answer = _invoke(served, body)
    assert status == 200
    assert _shapes(answer) == [(5, WIDTH), (2, WIDTH)]


def test_a_bare_list_under_inputs_is_refused_saying_how_to_send_sentences(served: Server) -> None:
    status, answer = _invoke(served, {"inputs": [JOHN, "Hi!"]})
    assert status == 400
    assert 'a bare list under "inputs"' in answer["message"]
    assert '{"inputs": [{"sentence": "..."}, ...]}' in answer["message"]


def test_a_list_of_sentences_in_one_inputs_record_is_refused(served: Server) -> None:
    status, answer = _invoke(served, {"inputs": {"sentence": [JOHN, "Hi!"]}})
    assert status == 400
    assert "'sentence' holds one text per row" in answer["message"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"params": {"output": "bogus"}}, "key 'params.output': output must be one of"),
        ({"params": {"output": "layer", "layer": 7}}, "layer 7 out of range for 3 layers"),
        ({"params": {"output": "mix", "weights": [1, 2]}}, "2 mix weights for 3 layers"),
        ({"params": {"batch_size": 0}}, "batch_size must be positive"),
        ({"params": {"layers": 2}}, "unknown predict params ['layers']"),
        ({"dataframe_records": [{"text": JOHN}]}, "needs a 'sentence' (text) or 'tokens'"),
    ],
    ids=["output", "layer", "weights", "batch_size", "unknown-param", "wrong-column"],
)
def test_a_bad_request_answers_400_naming_the_problem(
    served: Server, body: dict[str, Any], problem: str
) -> None:
    status, answer = _invoke(served, {"dataframe_records": [{"sentence": JOHN}], **body})
    assert status == 400
    assert answer["error_code"] == "INVALID_PARAMETER_VALUE"
    cause, _, echo = answer["message"].partition("\n")
    assert problem in cause  # the cause first, MLflow's echo of the request after it
    assert echo.startswith("Failed to predict data")


def test_sentences_without_tokens_answer_no_vectors_and_no_mean(served: Server) -> None:
    status, answer = _invoke(served, {"inputs": [{"sentence": ""}, {"sentence": " "}]})
    assert status == 200
    assert answer["predictions"] == [{"tokens": [], "embeddings": [[]] * NUM_LAYERS}] * 2
    body = {"dataframe_records": [{"tokens": []}], "params": {"output": "mix", "mean_pool": True}}
    status, answer = _invoke(served, body)
    assert status == 200
    assert answer["predictions"] == [{"tokens": [], "embeddings": None}]


@pytest.mark.parametrize(
    ("records", "cause"),
    [
        (
            [{"sentence": "word " * (MAX_TOKENS + 1)}],
            f"row 0: 'sentence' has {MAX_TOKENS + 1} tokens, over the limit of {MAX_TOKENS} per "
            f"sentence ({MAX_TOKENS_ENV} where the model runs)",
        ),
        (
            [{"tokens": ["Hi"]}] * (MAX_ROWS + 1),
            f"the request has {MAX_ROWS + 1} rows, over the limit of {MAX_ROWS} per request "
            f"({MAX_ROWS_ENV} where the model runs)",
        ),
    ],
    ids=["tokens", "rows"],
)
def test_a_request_over_a_limit_answers_400_that_leads_with_the_limit(
    served: Server, records: list[dict[str, Any]], cause: str
) -> None:
    status, answer = _invoke(served, {"dataframe_records": records})
    assert status == 400
    assert answer["message"].startswith(cause)
    assert len(answer["message"]) < len(cause) + 300  # MLflow's echo of the request is cut


def test_the_log_has_no_download_bar_and_no_warning_for_a_refused_param(served: Server) -> None:
    status, _ = _invoke(served, {"inputs": [{"sentence": JOHN}], "params": {"outptu": "mix"}})
    assert status == 400
    deadline = time.monotonic() + 10
    while '"POST /invocations HTTP/1.1" 400' not in (log := served.log.read_text()):
        assert time.monotonic() < deadline, f"no access line for the 400:\n{log[-3000:]}"
        time.sleep(0.1)
    assert "Downloading artifacts" not in log
    assert "Unrecognized params" not in log
