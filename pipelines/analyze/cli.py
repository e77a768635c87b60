"""``elmo analyze`` and ``python -m pipelines.analyze``: the options of
:func:`pipelines.analyze.stage.analyze`, imported only when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from elmo_core.errors import ConfigError
from pipelines.common.cli_runner import OPTIONS_HELP, SOURCE_HELP, comma_separated, run_command


def analyze_command(
    task: Annotated[
        list[Path] | None, typer.Option(help="task config YAML (repeat for several)")
    ] = None,
    bilm: Annotated[str | None, typer.Option(help=SOURCE_HELP)] = None,
    bilm_options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    senses_train: Annotated[Path | None, typer.Option(help="sense-labelled training file")] = None,
    senses_test: Annotated[Path | None, typer.Option(help="sense-labelled test file")] = None,
    fractions: Annotated[
        str | None,
        typer.Option(help="training fractions, comma-separated (default 0.01,0.05,0.1,0.25,1)"),
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help="seeds, comma-separated (default 0,1,2)")
    ] = None,
    every_layer: Annotated[
        bool,
        typer.Option(
            help="train each layer alone even where the mix gains nothing on all of train"
        ),
    ] = False,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="key=value override for every task")
    ] = None,
    parent_run_id: Annotated[str | None, typer.Option(help="MLflow parent run")] = None,
    compare_runs: Annotated[
        tuple[str, str] | None, typer.Option("--compare", help="two analyze run ids")
    ] = None,
) -> None:
    """The paper's §5 for a biLM: sample efficiency, per layer, placement, sense and POS probes.

    Task heads are 64 wide where a task config sets no head.hidden_dim: the analysis asks which
    layer and how much data, which a narrower head answers as the task's 200-wide one does.
    """
    from elmo_core.analysis.task_runs import DEFAULT_FRACTIONS
    from elmo_core.tasks import load_task_config
    from elmo_core.tasks.seeds import DEFAULT_SEEDS
    from pipelines.analyze.stage import analyze, compare
    from pipelines.analyze.table import format_rows

    if compare_runs is not None:
        typer.echo(compare(*compare_runs))
        return
    if bilm is None or not task:
        raise ConfigError("give --bilm and at least one --task (or --compare RUN_A RUN_B)")
    if (senses_train is None) != (senses_test is None):
        raise ConfigError("give both --senses-train and --senses-test", key="senses")
    result = analyze(
        [load_task_config(path, set_ or []) for path in task],
        bilm,
        bilm_options=bilm_options,
        senses=(senses_train, senses_test) if senses_train and senses_test else None,
        fractions=(
            DEFAULT_FRACTIONS
            if fractions is None
            else comma_separated(fractions, float, "fractions")
        ),
        seeds=DEFAULT_SEEDS if seeds is None else comma_separated(seeds, int, "seeds"),
        every_layer=every_layer,
        parent_run_id=parent_run_id,
    )
    if result.reused:
        typer.echo(
            f"reused analyze run {result.run_id}: it analyzed these weights, tasks and settings"
        )
    typer.echo(format_rows(result.rows))
    typer.echo("\n".join(["", *result.headline]))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.analyze``: the same command as ``elmo analyze``."""
    return run_command(analyze_command, argv)
