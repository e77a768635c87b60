"""``elmo adapt`` and ``python -m pipelines.adapt``: the options of
:func:`pipelines.adapt.stage.adapt`, imported only when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.common.cli_runner import OPTIONS_HELP, SOURCE_HELP, comma_separated, run_command


def adapt_command(
    task: Annotated[list[Path], typer.Option(help="task config YAML (repeat for several)")],
    bilm: Annotated[str, typer.Option(help=SOURCE_HELP)],
    bilm_options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value override for every task")
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(help="seeds, comma-separated: scores are means over them (default 0,1,2)"),
    ] = None,
    parent_run_id: Annotated[str | None, typer.Option(help="MLflow parent run")] = None,
    cpus_per_task: Annotated[float, typer.Option(help="Ray CPUs per job")] = 1.0,
    gpus_per_task: Annotated[
        float | None, typer.Option(help="Ray GPUs per job (default: 1 if any)")
    ] = None,
) -> None:
    """Adapt a frozen biLM to downstream tasks; report the gain over the baseline."""
    from elmo_core.tasks import load_task_config
    from elmo_core.tasks.seeds import DEFAULT_SEEDS
    from elmo_core.tasks.trainer import BASELINE
    from pipelines.adapt.stage import AdaptResources, adapt, result_line

    tasks = [load_task_config(path, set_ or []) for path in task]
    resources = AdaptResources(cpus_per_task=cpus_per_task, gpus_per_task=gpus_per_task)
    results = adapt(
        tasks,
        bilm,
        bilm_options=bilm_options,
        seeds=DEFAULT_SEEDS if seeds is None else comma_separated(seeds, int, "seeds"),
        parent_run_id=parent_run_id,
        resources=resources,
    )
    for result in results:
        typer.echo(result_line(result))
    typer.echo(f"baseline: {BASELINE}")


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.adapt``: the same command as ``elmo adapt``."""
    return run_command(adapt_command, argv)
