"""The ``elmo`` command: every stage listed, and a stage imports only what it needs."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from elmo_core.analysis.task_runs import DEFAULT_FRACTIONS
from elmo_core.tasks.seeds import DEFAULT_SEEDS
from pipelines.cli import STAGES, main


def test_help_lists_every_stage(capsys):
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in STAGES)


def test_an_unknown_command_is_a_usage_error(capsys):
    assert main(["nope"]) == 2
    assert "No such command 'nope'" in capsys.readouterr().err


def test_prepare_does_not_import_the_training_stack():
    code = (
        "import sys; from pipelines.cli import main; status = main(['prepare', '--help']); "
        "print(status, sorted(m for m in ('torch', 'mlflow', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "0 []"


@pytest.mark.parametrize(
    ("stage", "defaults"),
    [
        ("adapt", [DEFAULT_SEEDS]),
        ("analyze", [DEFAULT_FRACTIONS, DEFAULT_SEEDS]),
    ],
)
def test_the_help_names_the_defaults_the_command_fills_in(stage, defaults, capsys):
    """The help is built without importing the stage, so it states the defaults as text."""
    assert main([stage, "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for values in defaults:
        assert f"(default {','.join(f'{value:g}' for value in values)})" in shown


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_mistyped_option_prints_the_usage_and_the_problem_and_exits_2(stage, capsys):
    assert main([stage, "--no-such-option", "x"]) == 2
    err = capsys.readouterr().err
    assert "Usage: " in err and f" {stage} [OPTIONS]" in err
    assert "No such option: --no-such-option" in err
    assert "Traceback" not in err


REQUIRED_ARGS = {  # the least each stage parses; the server check comes before any of it is used
    "prepare": ["--corpus", "python-docs", "--out", "out"],
    "train": ["--data", "dataset"],
    "evaluate": ["--checkpoint", "model", "--data", "dataset"],
    "register": ["model", "dataset"],
    "promote": ["--version", "1"],
    "import-weights": ["--options", "options.json", "--weights", "weights.hdf5"],
    "adapt": ["--task", "task.yaml", "--bilm", "model"],
    "analyze": ["--task", "task.yaml", "--bilm", "model"],
    "embed": ["--bilm", "model", "--input", "in.txt", "--out", "out"],
}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_names_an_mlflow_server_that_does_not_answer_before_any_work(
    stage, capsys, monkeypatch
):
    address = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", address)
    assert main([stage, *REQUIRED_ARGS[stage]]) == 2
    err = capsys.readouterr().err
    assert f"error: MLFLOW_TRACKING_URI={address}: the MLflow tracking server does not" in err
    assert "Traceback" not in err


def test_every_stage_names_a_ray_address_that_does_not_answer(capsys, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_closed_port()}")
    assert main(["train", *REQUIRED_ARGS["train"]]) == 2
    assert "RAY_ADDRESS=127.0.0.1:" in capsys.readouterr().err
