"""``elmo prepare`` and ``python -m pipelines.prepare``: the options of
:func:`pipelines.prepare.stage.prepare`, imported only when the command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from pipelines.common.cli_runner import run_command


def prepare_command(
    corpus: Annotated[str, typer.Option(help="corpus path or URL, or 'python-docs'")],
    out: Annotated[str, typer.Option(help="dataset directory or fsspec URL (s3://...)")],
    format: Annotated[
        str | None,
        typer.Option(
            help="text (raw, Moses in --set tokenizer.lang=LANG, default en) | tokenized (a "
            "sentence per line, tokens split on whitespace) | 1b-benchmark"
        ),
    ] = None,
    max_vocab: Annotated[
        int | None, typer.Option(help="vocabulary size, specials included")
    ] = None,
    min_count: Annotated[int | None, typer.Option(help="minimum training count")] = None,
    vocab: Annotated[str | None, typer.Option(help="import this vocabulary file")] = None,
    workers: Annotated[
        int | None, typer.Option(help="worker processes (Ray tasks) at once")
    ] = None,
    executor: Annotated[
        str | None, typer.Option(help="processes (this machine) | ray (RAY_ADDRESS or local)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="shuffle / heldout seed")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of PrepareConfig keys")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="key=value override")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace another dataset found in --out")] = False,
) -> None:
    """Prepare a corpus into Parquet shards, vocab.txt and manifest.json."""
    from elmo_core.config import PrepareConfig, resolve_config
    from pipelines.prepare.pool import tune_process
    from pipelines.prepare.stage import prepare, split_lines

    tune_process()  # this process exists to prepare (`elmo prepare` or `python -m`)
    flags = {
        "format": format,
        "max_vocab": max_vocab,
        "min_count": min_count,
        "vocab_file": vocab,
        "workers": workers,
        "executor": executor,
        "seed": seed,
    }
    overrides = [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]
    cfg = resolve_config(PrepareConfig, None, config, [*overrides, *(set_ or [])])
    result = prepare(cfg, corpus, out, overwrite=overwrite)
    for line in split_lines(result.manifest):
        typer.echo(line)
    typer.echo(
        f"vocabulary {result.manifest.vocab.size}, {result.manifest.word_types.num_types} "
        f"word types; {result.num_shards_written} shards written, "
        f"{result.num_shards_skipped} reused, {result.seconds:.1f}s → {result.dataset}"
    )
    phases = ", ".join(f"{name} {sec:.2f}s" for name, sec in result.phase_seconds.items())
    typer.echo(f"phases: {phases}")


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.prepare``: the same command as ``elmo prepare``."""
    return run_command(prepare_command, argv)
