"""``elmo evaluate`` and ``python -m pipelines.evaluate``: the options of
:func:`pipelines.evaluate.stage.evaluate_bilm`, imported only when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.common.cli_runner import SOURCE_HELP, run_command


def evaluate_command(
    checkpoint: Annotated[str, typer.Option(help=SOURCE_HELP)],
    data: Annotated[str, typer.Option(help="prepared dataset directory or fsspec URL")],
    split: Annotated[str, typer.Option(help="split to evaluate")] = "heldout",
    files: Annotated[list[str] | None, typer.Option(help="only these heldout files")] = None,
    protocol: Annotated[str, typer.Option(help="batched (128×20) | original (256×1)")] = "batched",
    batch_size: Annotated[int | None, typer.Option(help="rows (default by protocol)")] = None,
    workers: Annotated[int | None, typer.Option(help="Ray tasks (default: in-process)")] = None,
    output: Annotated[
        Path | None, typer.Option(help="write the result as JSON (for elmo register)")
    ] = None,
) -> None:
    """Heldout perplexity (forward, backward, geometric mean) of a biLM, logged to MLflow."""
    if protocol not in ("batched", "original"):
        raise typer.BadParameter(f"{protocol!r} is not batched or original", param_hint="protocol")
    from elmo_core.perplexity import describe_trapped_rows
    from pipelines.evaluate.stage import evaluate_bilm

    result = evaluate_bilm(
        checkpoint,
        data,
        split=split,
        files=files,
        workers=workers,
        protocol=protocol,  # type: ignore[arg-type]
        batch_size=batch_size,
    )
    trapped = describe_trapped_rows(
        result.forward_trapped, result.backward_trapped, result.num_rows
    )
    typer.echo(
        f"{split} perplexity {result.perplexity:.3f} (forward {result.forward_perplexity:.3f}, "
        f"backward {result.backward_perplexity:.3f}) on every {split} token scored "
        f"({result.num_tokens:,}, {result.protocol} protocol"
        f"{', files ' + ', '.join(files) if files else ''}){'; ' + trapped if trapped else ''}"
    )
    if output is not None:
        result.write(output)


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.evaluate``: the same command as ``elmo evaluate``."""
    return run_command(evaluate_command, argv)
