"""The ``elmo`` command: one sub-command per stage, each the same ``main`` as ``python -m``.

User-caused errors (:class:`~elmo_core.errors.ElmoError`) print one line and exit with status 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import typer

from elmo_core.errors import ElmoError
from pipelines.adapt import adapt_command
from pipelines.evaluate import evaluate_command
from pipelines.import_weights import import_weights_command
from pipelines.prepare import prepare_command
from pipelines.register import register_command
from pipelines.registry_policy import promote_command
from pipelines.train import train_command

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


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


def run_app(typer_app: typer.Typer, argv: list[str] | None = None) -> int:
    """Run a typer app as a function: the exit status, with user errors printed as one line."""
    try:
        typer_app(args=argv, standalone_mode=False)
    except ElmoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except SystemExit as done:
        return int(done.code or 0)
    except Exception as err:  # click's usage errors
        import click

        if isinstance(err, click.ClickException):
            err.show()
            return err.exit_code
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_app(app, argv)


def console_main() -> None:
    """The ``elmo`` console script."""
    raise SystemExit(main())


if __name__ == "__main__":
    console_main()
