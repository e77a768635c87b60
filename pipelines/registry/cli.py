"""``elmo register``, ``elmo promote`` and ``elmo import-weights`` (also ``python -m
pipelines.registry``): the options of the registry's functions, imported when a command runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from pipelines.common.cli_runner import (
    OPTIONS_HELP,
    SOURCE_HELP,
    command_app,
    run_commands,
)
from pipelines.registry.tags import CHAMPION, DEFAULT_NAME


def register_command(
    source: Annotated[str, typer.Argument(help=SOURCE_HELP)],
    dataset: Annotated[str, typer.Argument(help="prepared dataset directory or fsspec URL")],
    evaluation: Annotated[
        Path | None, typer.Option(help="evaluation result JSON (elmo evaluate --output)")
    ] = None,
    options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    name: Annotated[str, typer.Option(help="registered model name")] = DEFAULT_NAME,
    run_id: Annotated[
        str | None, typer.Option(help="the training run it came from (registered once)")
    ] = None,
    hdf5: Annotated[bool, typer.Option(help="also log a bilm-tf HDF5 export")] = True,
) -> None:
    """Register a trained biLM as a new version of an MLflow model (once per training run)."""
    from pipelines.evaluate.result import EvaluationResult
    from pipelines.registry.register import register

    result = register(
        source,
        dataset,
        evaluation=None if evaluation is None else EvaluationResult.read(evaluation),
        options=options,
        run_id=run_id,
        name=name,
        hdf5_export=hdf5,
    )
    perplexity = "no evaluation" if result.perplexity is None else f"{result.perplexity:.2f}"
    decision = "" if result.decision is None else f": {result.decision.reason}"
    already = "" if result.newly_registered else ", registered before"
    typer.echo(
        f"{result.uri} (run {result.run_id}{already}, heldout perplexity {perplexity}, "
        f"alias {result.alias}{decision})"
    )


def promote_command(
    version: Annotated[int, typer.Option(help="model version number to promote")],
    name: Annotated[str, typer.Option(help="registered model name")] = DEFAULT_NAME,
    alias: Annotated[str, typer.Option(help="alias to set")] = CHAMPION,
) -> None:
    """Set an alias (default champion) on a model version by hand."""
    from pipelines.registry.policy import promote

    previous = promote(name, version, alias)
    replaced = "" if previous in (None, version) else f" (was version {previous})"
    typer.echo(f"models:/{name}@{alias} → version {version}{replaced}")


def import_weights_command(
    options: Annotated[Path, typer.Option(help="bilm-tf options.json")],
    weights: Annotated[Path, typer.Option(help="bilm-tf weights HDF5")],
    name: Annotated[str, typer.Option(help="registered model name")] = DEFAULT_NAME,
    softmax: Annotated[
        Path | None, typer.Option(help="softmax HDF5 (softmax/W, softmax/b); needs --vocab")
    ] = None,
    vocab: Annotated[Path | None, typer.Option(help="vocabulary, one token per line")] = None,
    tokenizer: Annotated[
        str, typer.Option(help="how the pyfunc model tokenizes text: whitespace | moses")
    ] = "whitespace",
    alias: Annotated[
        str | None, typer.Option(help="set this alias (e.g. champion) instead of the policy's")
    ] = None,
    parent_run_id: Annotated[str | None, typer.Option(help="nest the run under this one")] = None,
) -> None:
    """Register released bilm-tf weights as a new version of an MLflow model."""
    from pipelines.registry.import_weights import import_weights

    result = import_weights(
        options,
        weights,
        name=name,
        softmax_file=softmax,
        vocab_file=vocab,
        alias=alias,
        parent_run_id=parent_run_id,
        tokenizer=tokenizer,  # type: ignore[arg-type]  # import_weights checks the choices first
    )
    typer.echo(f"{result.uri} (run {result.run_id}, alias {result.alias})")


COMMANDS: dict[str, Callable[..., None]] = {
    "register": register_command,
    "promote": promote_command,
    "import-weights": import_weights_command,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.registry register|promote|import-weights``: the ``elmo`` commands."""
    app = command_app(COMMANDS, no_args_is_help=True)
    return run_commands(app, argv, prog_name="python -m pipelines.registry")
