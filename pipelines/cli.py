"""The ``elmo`` command: one sub-command per stage, each the same command as its ``python -m``.

Each stage's ``cli.py`` imports its stage only when the command runs, so ``elmo prepare`` never
pays for the torch, MLflow and Ray imports of the others and ``elmo --help`` for none
(benchmarks/results/cli_startup-2026-11-27.md).
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
