"""The ``elmo`` command: every stage listed, and a stage imports only what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_mistyped_option_prints_the_usage_and_the_problem_and_exits_2(stage, capsys):
    assert main([stage, "--no-such-option", "x"]) == 2
    err = capsys.readouterr().err
    assert "Usage: " in err and f" {stage} [OPTIONS]" in err
    assert "No such option: --no-such-option" in err
    assert "Traceback" not in err
