"""The ``elmo`` command: one sub-command per stage, each the same ``main`` as ``python -m``.

A stage's module is imported only when its command runs: ``elmo prepare`` must not pay for the
torch, MLflow and Ray imports of the other stages (~3.5 s and ~300 MB before it reads a byte).
``elmo --help`` imports them all to list their help. User-caused errors
(:class:`~elmo_core.errors.ElmoError`) print one line and exit with status 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import click

from pipelines.common.cli_runner import run_app, run_command
from pipelines.common.console import quiet_environment

STAGES = {  # command name -> (module, typer command function)
    "prepare": ("pipelines.prepare.stage", "prepare_command"),
    "train": ("pipelines.train.stage", "train_command"),
    "evaluate": ("pipelines.evaluate.stage", "evaluate_command"),
    "register": ("pipelines.registry.register", "register_command"),
    "promote": ("pipelines.registry.policy", "promote_command"),
    "import-weights": ("pipelines.registry.import_weights", "import_weights_command"),
    "adapt": ("pipelines.adapt.stage", "adapt_command"),
    "analyze": ("pipelines.analyze.stage", "analyze_command"),
    "embed": ("pipelines.embed.stage", "embed_command"),
}


class StageCommands(click.Group):
    """The stages (all, or the ``commands`` named), each imported from its module when asked for."""

    def __init__(self, *args: Any, commands: Sequence[str] = tuple(STAGES), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage_names = list(commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self.stage_names

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The stage's typer command run as its ``main`` runs it, on every argument unparsed.

        A stage is a typer command, and typer (0.26+) parses with its own copy of click, so it
        runs behind a plain click command rather than as a sub-command of this click group.
        """
        if cmd_name not in self.stage_names:
            return None
        module, function = STAGES[cmd_name]
        command = getattr(_import_uncollected(module), function)

        @click.pass_context
        def run(invoked: click.Context, args: tuple[str, ...]) -> None:
            raise SystemExit(run_command(command, list(args), prog_name=invoked.command_path))

        return click.Command(
            cmd_name,
            callback=run,
            params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
            help=command.__doc__,
            context_settings={"ignore_unknown_options": True},
            add_help_option=False,
        )


def _import_uncollected(name: str) -> ModuleType:
    """Import a stage's module with the garbage collector paused: an import creates tens of
    thousands of objects that live as long as the process, and the collections their creation
    sets off (~0.05 s for ``prepare``) find nothing to free."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(name)
    finally:
        if was_enabled:
            gc.enable()


app = StageCommands(
    name="elmo",
    no_args_is_help=True,
    help="Pretrain and adapt ELMo: prepare → train → evaluate → register → adapt.",
)


def main(argv: list[str] | None = None) -> int:
    return run_app(app, argv)


def console_main() -> None:
    """The ``elmo`` console script; the libraries' chatter is switched off before a stage imports
    them (MLflow reads its logging level on import)."""
    quiet_environment()
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
