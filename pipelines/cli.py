"""The ``elmo`` command: one sub-command per stage, each the same command as its ``python -m``.

Each stage's command lives in its ``cli.py``, which imports the stage itself only when the command
runs: ``elmo prepare`` must not pay for the torch, MLflow and Ray imports of the other stages
(~3.5 s and ~300 MB before it reads a byte), and ``elmo --help`` imports none of them. User-caused
errors (:class:`~elmo_core.errors.ElmoError`) print one line and exit with status 2; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines.adapt.cli import adapt_command
from pipelines.analyze.cli import analyze_command
from pipelines.common.cli_runner import command_app, run_commands
from pipelines.embed.cli import embed_command
from pipelines.evaluate.cli import evaluate_command
from pipelines.prepare.cli import prepare_command
from pipelines.registry.cli import import_weights_command, promote_command, register_command
from pipelines.train.cli import train_command

STAGES: dict[str, Callable[..., None]] = {
    "prepare": prepare_command,
    "train": train_command,
    "evaluate": evaluate_command,
    "register": register_command,
    "promote": promote_command,
    "import-weights": import_weights_command,
    "adapt": adapt_command,
    "analyze": analyze_command,
    "embed": embed_command,
}

app = command_app(
    STAGES,
    name="elmo",
    no_args_is_help=True,
    help="Pretrain and adapt ELMo: prepare → train → evaluate → register → adapt.",
)


def main(argv: list[str] | None = None) -> int:
    return run_commands(app, argv, prog_name="elmo")


def console_main() -> None:
    """The ``elmo`` console script."""
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
