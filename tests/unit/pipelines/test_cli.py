"""The ``elmo`` command: every stage listed, and a stage imports only what it needs."""

from __future__ import annotations

import subprocess
import sys

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
