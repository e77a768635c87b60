"""The ``elmo`` command: one sub-command per stage, each the same ``main`` as ``python -m``.

User-caused errors (:class:`~elmo_core.errors.ElmoError`) print one line and exit with status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import typer

from pipelines.adapt import adapt_command
from pipelines.cli_runner import run_app
from pipelines.evaluate import evaluate_command
from pipelines.import_weights import import_weights_command
from pipelines.prepare import prepare_command
from pipelines.register import register_command
from pipelines.registry_policy import promote_command
from pipelines.train import train_command

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Pretrain and adapt ELMo: prepare → train → evaluate → register → adapt.",
)


@app.callback()
def _root() -> None:
    """Pretrain and adapt ELMo: prepare → train → evaluate → register → adapt."""


app.command("prepare")(prepare_command)
app.command("train")(train_command)
app.command("evaluate")(evaluate_command)
app.command("register")(register_command)
app.command("promote")(promote_command)
app.command("import-weights")(import_weights_command)
app.command("adapt")(adapt_command)


def main(argv: list[str] | None = None) -> int:
    return run_app(app, argv)


def console_main() -> None:
    """The ``elmo`` console script."""
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
