"""Run a typer app as a function, turning user errors into one line and exit status 2.

Shared by the ``elmo`` command (:mod:`pipelines.cli`) and each stage's own ``python -m
pipelines.<stage>``, whose commands (``pipelines/<stage>/cli.py``) import their stage when they run.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click
import typer
from typer._click import exceptions as typer_click

from elmo_core.errors import ConfigError, ElmoError
from pipelines.common.console import quiet_environment
from pipelines.common.services import check_services

# typer parses with its own copy of click, whose exceptions are not click's: both are usage errors.
CLICK_ERRORS = (click.ClickException, typer_click.ClickException)

# The help of the options that name a biLM (resolved by pipelines.serving.bilm_loader).
SOURCE_HELP = (
    "biLM: model, checkpoint or run directory (local or fsspec URL), bilm-tf HDF5 (with its "
    "options), models:/name/N, models:/name@alias or runs:/ URI"
)
OPTIONS_HELP = "bilm-tf options.json of an HDF5 biLM"


def run_app(
    app: typer.Typer | click.Command, argv: list[str] | None = None, prog_name: str | None = None
) -> int:
    """Run a typer app or click command as a function: the exit status, with user errors
    printed as one line."""
    try:
        status = app(args=argv, prog_name=prog_name, standalone_mode=False)
    except ElmoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the stage has ended its MLflow run as KILLED
        print("interrupted", file=sys.stderr)
        return 130
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except SystemExit as done:
        return int(done.code or 0)
    except CLICK_ERRORS as err:  # a usage error: the usage line and the problem, status 2
        err.show()
        return err.exit_code
    return status if isinstance(status, int) else 0  # a raised typer.Exit(code) returns code


def command_app(commands: Mapping[str, Callable[..., Any]], **settings: Any) -> typer.Typer:
    """A typer app of stage commands (``elmo``), each checking the services once its options
    parse."""
    app = _plain_app(**settings)
    for name, command in commands.items():
        app.command(name)(_checking_services(command))
    return app


def _plain_app(**settings: Any) -> typer.Typer:
    """A typer app whose help is click's plain text, as ``elmo --help`` has always been, not Rich's
    boxes (whose import would be most of a ``--help``'s time)."""
    return typer.Typer(add_completion=False, rich_markup_mode=None, **settings)


def run_commands(
    app: typer.Typer, argv: list[str] | None = None, prog_name: str | None = None
) -> int:
    """Run stage commands as their process: SIGTERM (a cancelled job) interrupts a command as
    Ctrl-C does, so its MLflow run ends KILLED."""
    quiet_environment()  # before a stage imports MLflow or starts Ray
    with _sigterm_interrupts():
        return run_app(app, argv, prog_name)


def run_command(
    command: Callable[..., Any], argv: list[str] | None = None, prog_name: str | None = None
) -> int:
    """A stage's ``main``: run its one typer command as ``python -m pipelines.<stage>`` does.

    Once its options parse, the command first checks that the configured MLflow server and Ray
    address answer, so a dead one is named in a second rather than after minutes of work.
    """
    app = _plain_app()
    app.command()(_checking_services(command))
    return run_commands(app, argv, prog_name)


def _checking_services(command: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(command)  # typer reads the options from the wrapped signature
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_services(ray_jobs=False)
        return command(*args, **kwargs)

    return checked


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def comma_separated(text: str, kind: type[float] | type[int], key: str) -> list[Any]:
    """``--seeds 0,1,2``-style option text as numbers; anything else is a user error on ``key``."""
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"not a comma-separated list of numbers: '{text}'", key=key) from None
