"""Run a typer app as a function, turning user errors into one line and exit status 2.

Shared by the ``elmo`` command (:mod:`pipelines.cli`) and each stage's own ``python -m
pipelines.<stage>``, so that neither imports more stages than the one it runs.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
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


def run_command(
    command: Callable[..., Any], argv: list[str] | None = None, prog_name: str | None = None
) -> int:
    """A stage's ``main``: run its one typer command as ``python -m pipelines.<stage>`` does.

    Once its options parse, the command first checks that the configured MLflow server and Ray
    address answer, so a dead one is named in a second rather than after minutes of work; SIGTERM
    (a cancelled job) interrupts it as Ctrl-C does, so its MLflow run ends KILLED.
    """
    quiet_environment()  # before a stage imports MLflow or starts Ray
    app = typer.Typer(add_completion=False)
    app.command()(_checking_services(command))
    with _sigterm_interrupts():
        return run_app(app, argv, prog_name)


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
