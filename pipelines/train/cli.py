"""The options of :func:`pipelines.train.stage.train` as a command, whose trained run
:mod:`pipelines.cli` then hands to evaluate and register with options of its own (``elmo train``,
``python -m pipelines.train``): chaining stages is not a stage's job. The stage is imported only
when the command runs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NamedTuple

import typer

from pipelines.common.cli_runner import OPTIONS_HELP, SOURCE_HELP

if TYPE_CHECKING:
    from pipelines.common.handoff import TrainResult
    from pipelines.train.job_config import TrainJobConfig


class Trained(NamedTuple):
    """A finished training run, its dataset (absolute) and its MLflow parent run."""

    result: TrainResult
    data: str
    parent_run_id: str | None


def train_command(
    data: Annotated[str, typer.Option(help="prepared dataset directory or URL")],
    model: Annotated[
        str | None, typer.Option(help="preset (tiny|mini|small|medium|original) or file")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML with model/train/run sections")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="section.key=value")] = None,
    job_config: Annotated[
        str | None,
        typer.Option(help="a resolved config (JSON, as a Ray Job is given it) instead of these"),
    ] = None,
    init_from: Annotated[str | None, typer.Option(help=f"start from this {SOURCE_HELP}")] = None,
    init_options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    parent_run_id: Annotated[str | None, typer.Option(help="MLflow parent run")] = None,
    tag: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE tag of the MLflow run (repeatable)")
    ] = None,
) -> Trained:
    """Pretrain a biLM on Ray Train."""
    from elmo_core.location import absolute_location
    from pipelines.train.stage import train
    from pipelines.train.supervision import TrainingInterrupted

    cfg = _job_config(model, config, set_ or [], job_config)
    tags = dict(_key_value(text) for text in tag or [])
    try:
        result = train(
            cfg,
            data,
            init_from=init_from,
            init_options=init_options,
            parent_run_id=parent_run_id,
            tags=tags,
        )
    except TrainingInterrupted as stopped:
        where = (
            "from the start"
            if stopped.checkpoint is None
            else (f"from its checkpoint at step {stopped.checkpoint.step}")
        )
        typer.echo(
            f"interrupted: {stopped.run_name} stopped; the same command resumes it {where}:\n"
            f"  {_this_command()}",
            err=True,
        )
        raise typer.Exit(130) from None
    verb = "already finished" if result.already_finished else "finished"
    best = "none" if result.best_perplexity is None else f"{result.best_perplexity:.2f}"
    typer.echo(
        f"{result.run_name} {verb}: {result.steps}/{result.total_steps} steps, best validation "
        f"perplexity {best} (heldout sample), model → {result.model_dir}"
    )
    return Trained(result, absolute_location(data), parent_run_id)


def _job_config(
    model: str | None, config: Path | None, overrides: list[str], job_config: str | None
) -> TrainJobConfig:
    """The config from ``--job-config`` (already resolved), else resolved from the others."""
    from pipelines.train.job_config import resolve_train_config
    from pipelines.train.ray_job import read_job_config

    if job_config is None:
        return resolve_train_config(model, config, overrides)
    if model is not None or config is not None or overrides:
        raise typer.BadParameter(
            "a resolved config takes no --model, --config or --set", param_hint="--job-config"
        )
    return read_job_config(job_config)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"'{text}' is not KEY=VALUE", param_hint="--tag")
    return key, value


def _this_command() -> str:
    """The command line this process was started with, as the user would type it again."""
    program = Path(sys.argv[0]).name
    if program == "elmo":
        return shlex.join(["elmo", *sys.argv[1:]])
    return shlex.join(["python", "-m", "pipelines.train", *sys.argv[1:]])
