"""``elmo embed`` and ``python -m pipelines.embed``: the options of
:func:`pipelines.embed.stage.embed`, imported only when the command runs."""

from __future__ import annotations

from typing import Annotated

import typer

from pipelines.common.cli_runner import OPTIONS_HELP, SOURCE_HELP, run_command
from pipelines.embed.inputs import DEFAULT_BATCH_SIZE, DEFAULT_SENTENCES_PER_SHARD


def embed_command(
    bilm: Annotated[str, typer.Option(help=SOURCE_HELP)],
    input: Annotated[
        str, typer.Option(help="one sentence per line: a file, directory, glob or URL")
    ],
    out: Annotated[str, typer.Option(help="output directory or fsspec URL")],
    options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    output: Annotated[
        str, typer.Option(help="all (L×T×2P) | top (T×2P) | mix: layer average (T×2P) | mean (2P)")
    ] = "all",
    format: Annotated[
        str, typer.Option(help="parquet (a shard per chunk) | hdf5 (AllenNLP's elmo layout)")
    ] = "parquet",
    dtype: Annotated[str, typer.Option(help="float32 | float16")] = "float32",
    batch_size: Annotated[
        int, typer.Option(help="sentences per forward pass")
    ] = DEFAULT_BATCH_SIZE,
    concurrency: Annotated[
        int | None, typer.Option(help="actors (default: one per GPU, else one per 2 CPUs)")
    ] = None,
    sentences_per_shard: Annotated[
        int, typer.Option(help="sentences per chunk: the unit of work and of resumption")
    ] = DEFAULT_SENTENCES_PER_SHARD,
    tokenized: Annotated[
        bool, typer.Option("--tokenized", help="lines are tokenized: split on whitespace")
    ] = False,
    manifest: Annotated[
        str | None,
        typer.Option(help="dataset manifest.json (or its directory) naming the tokenizer"),
    ] = None,
) -> None:
    """ELMo vectors for every sentence of a text, by an actor pool on Ray; resumable."""
    from pipelines.embed.stage import embed, summary_line

    result = embed(
        bilm,
        input,
        out,
        options=options,
        output=output,  # type: ignore[arg-type]  # embed checks the choices first
        format=format,  # type: ignore[arg-type]
        dtype=dtype,  # type: ignore[arg-type]
        batch_size=batch_size,
        concurrency=concurrency,
        sentences_per_shard=sentences_per_shard,
        tokenized=tokenized,
        manifest=manifest,
    )
    typer.echo(summary_line(result))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.embed``: the same command as ``elmo embed``."""
    return run_command(embed_command, argv)
