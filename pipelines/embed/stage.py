"""The embed stage: a corpus or task dataset → ELMo vectors per sentence, on Ray Data.

Everything a user can get wrong is checked in the driver before Ray starts; a rerun skips the
shards that exist, so a killed run resumes.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow

from elmo_core.errors import ConfigError, DataError
from elmo_core.location import absolute_location
from elmo_core.text.tokenize import Tokenizer, WhitespaceTokenizer
from pipelines.common.console import console_progress
from pipelines.common.ray_cluster import connect_ray
from pipelines.common.settings import elmo_home
from pipelines.embed.embedding_shards import DTYPES, Dtype, shard_name
from pipelines.embed.hdf5 import HDF5_FILE, write_hdf5
from pipelines.embed.inputs import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SENTENCES_PER_SHARD,
    Chunk,
    InputPlan,
    plan_chunks,
)
from pipelines.embed.output import FORMATS, EmbeddingsDir, Format
from pipelines.embed.vectors import OUTPUTS, Output
from pipelines.embed.workers import EmbedJob, WorkerPool, embed_chunks
from pipelines.prepare.corpus_sources import locate_corpus
from pipelines.serving.bilm_loader import (
    BiLMReference,
    load_bilm,
    manifest_tokenizer,
    resolve_bilm,
)
from pipelines.tracking.stage_runs import flatten_params, stage_run

FORMAT_VERSION = 1  # of the shards and embed.json
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class EmbedResult:
    """Where the vectors are and what this run did."""

    out: str
    files: list[str]  # the shards, or the one HDF5 file
    num_sentences: int  # in the input
    num_empty_lines: int  # skipped
    num_embedded: int  # sentences embedded by this run (the others were in existing shards)
    num_tokens: int  # tokens embedded by this run
    shards_written: int
    shards_skipped: int
    seconds: float
    run_id: str


def embed(
    bilm: str,
    input: str,
    out: str,
    *,
    options: str | None = None,
    output: Output = "all",
    format: Format = "parquet",
    dtype: Dtype = "float32",
    batch_size: int = DEFAULT_BATCH_SIZE,
    concurrency: int | None = None,
    sentences_per_shard: int = DEFAULT_SENTENCES_PER_SHARD,
    tokenized: bool = False,
    manifest: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> EmbedResult:
    """Embed every sentence of ``input`` with ``bilm`` into ``out`` (see the module doc),
    tracked as an ``embed`` run (a child of ``parent_run_id``'s inside a flow)."""
    started = time.perf_counter()
    _check_settings(output, format, dtype, batch_size, concurrency, sentences_per_shard)
    reference = resolve_bilm(bilm, options)  # a bad source fails before anything starts
    tokenizer = tokenizer_description(reference, tokenized, manifest)
    plan = plan_chunks(locate_inputs(input), sentences_per_shard)
    target = EmbeddingsDir(absolute_location(out))
    settings = _settings(reference, tokenizer, plan, output, format, dtype, sentences_per_shard)
    target.claim(settings)
    todo = _unfinished(target, plan, format)
    job = EmbedJob(reference, tokenizer, target.url, output, dtype, batch_size)
    run_tags = {**reference.tags, **(tags or {})}
    with stage_run(
        "embed", run_name=_run_name(input), parent_run_id=parent_run_id, tags=run_tags
    ) as run:
        given = {"bilm_source": bilm, "input": input, "out": target.url, "batch_size": batch_size}
        _log_params(given, settings)
        num_embedded, num_tokens, embed_seconds = _embed_on_ray(job, todo, concurrency)
        files = _finish(target, plan, output, format)
        seconds = time.perf_counter() - started
        result = EmbedResult(
            out=target.url,
            files=files,
            num_sentences=plan.num_sentences,
            num_empty_lines=plan.num_empty_lines,
            num_embedded=num_embedded,
            num_tokens=num_tokens,
            shards_written=len(todo),
            shards_skipped=len(plan.chunks) - len(todo),
            seconds=seconds,
            run_id=run.info.run_id,
        )
        _log_counts(result, embed_seconds)
    return result


def tokenizer_description(
    reference: BiLMReference, tokenized: bool, manifest: str | None
) -> dict[str, Any]:
    """The tokenizer raw lines go through, as a manifest describes it: whitespace for
    ``tokenized`` lines, else the one ``manifest`` names, else the biLM's own (a registered biLM
    carries its dataset's manifest; the biLM is loaded here to read it)."""
    if tokenized and manifest is not None:
        raise ConfigError("--tokenized lines need no tokenizer from a manifest", key="manifest")
    if tokenized:
        return WhitespaceTokenizer().describe()
    if manifest is not None:
        path = Path(manifest).expanduser().resolve()
        path = path / MANIFEST_FILE if path.is_dir() else path
        if not path.is_file():
            raise DataError("no such manifest file", path=path)
        try:
            description = manifest_tokenizer(path)
        except ValueError as err:
            raise DataError(f"not a JSON manifest: {err}", path=path) from None
        where = str(path)
    else:
        with tempfile.TemporaryDirectory(prefix="elmo-embed-") as scratch:
            description = load_bilm(reference, Path(scratch)).tokenizer
        where = f"the biLM {reference.location}"
    if description is None:
        raise ConfigError(
            f"{where} names no tokenizer for raw text (a registered biLM carries its dataset's; "
            "a model directory or bilm-tf file does not): give --manifest with the manifest.json "
            "of the dataset it was trained on, or --tokenized for whitespace-tokenized lines",
            key="manifest",
        )
    Tokenizer.from_manifest(description)  # an unknown tokenizer fails here, not in the actors
    return description


def locate_inputs(input: str) -> list[Path]:
    """The local text files of ``input``: a file, a directory, a glob, ``python-docs`` (the
    bundled sample corpus) or a URL (downloaded into ``ELMO_HOME``), as ``elmo prepare`` reads
    a text corpus."""
    return locate_corpus(input, "text", elmo_home() / "cache" / "corpora").train


def _check_settings(
    output: str,
    format: str,
    dtype: str,
    batch_size: int,
    concurrency: int | None,
    sentences_per_shard: int,
) -> None:
    for key, value, choices in (
        ("output", output, OUTPUTS),
        ("format", format, FORMATS),
        ("dtype", dtype, DTYPES),
    ):
        if value not in choices:
            raise ConfigError(f"{value!r} is not one of {', '.join(choices)}", key=key)
    for key, number in (
        ("batch_size", batch_size),
        ("concurrency", concurrency),
        ("sentences_per_shard", sentences_per_shard),
    ):
        if number is not None and number < 1:
            raise ConfigError(f"must be at least 1, not {number}", key=key)


def _settings(
    reference: BiLMReference,
    tokenizer: dict[str, Any],
    plan: InputPlan,
    output: Output,
    format: Format,
    dtype: Dtype,
    sentences_per_shard: int,
) -> dict[str, Any]:
    """What the vectors in ``out`` are (its ``embed.json``); the batch size and the number of
    actors are not in it: they do not change a vector."""
    return {
        "format_version": FORMAT_VERSION,
        "bilm": reference.location,
        "bilm_options": reference.options,
        "tokenizer": tokenizer,
        "inputs": [asdict(file) for file in plan.files],
        "output": output,
        "format": format,
        "dtype": dtype,
        "sentences_per_shard": sentences_per_shard,
    }


def _log_params(given: dict[str, object], settings: dict[str, Any]) -> None:
    """The settings as searchable params (the input files by number; their checksums are in
    ``embed.json``) and what was given."""
    flat = flatten_params({key: value for key, value in settings.items() if key != "inputs"})
    given = {**given, "input_files": len(settings["inputs"])}
    mlflow.log_params({**flat, **{key: str(value) for key, value in given.items()}})


def _unfinished(target: EmbeddingsDir, plan: InputPlan, format: Format) -> list[Chunk]:
    """The chunks whose shard is not there yet (none once the HDF5 file is)."""
    present = set(target.names())
    if format == "hdf5" and HDF5_FILE in present:
        return []
    return [chunk for chunk in plan.chunks if shard_name(chunk.index) not in present]


def _embed_on_ray(
    job: EmbedJob, chunks: list[Chunk], concurrency: int | None
) -> tuple[int, int, float]:
    """Sentences and tokens embedded, and the seconds it took; Ray starts only for work."""
    if not chunks:
        return 0, 0, 0.0
    connect_ray()
    pool = WorkerPool.for_cluster(concurrency)
    mlflow.log_params({"concurrency": pool.size, "device": "gpu" if pool.use_gpu else "cpu"})
    started = time.perf_counter()
    num_sentences = num_tokens = 0
    total = sum(chunk.num_sentences for chunk in chunks)
    with console_progress(total, "embedding", unit="sentence") as bar:
        for done in embed_chunks(job, chunks, pool):
            num_sentences += done.num_sentences
            num_tokens += done.num_tokens
            bar.update(done.num_sentences)
    return num_sentences, num_tokens, time.perf_counter() - started


def _finish(target: EmbeddingsDir, plan: InputPlan, output: Output, format: Format) -> list[str]:
    """The output's files: the shards, or the HDF5 file gathered from them (which are then
    removed: the file holds all they did)."""
    shards = [shard_name(chunk.index) for chunk in plan.chunks]
    if format == "parquet":
        return [target.join(name) for name in shards]
    if not target.exists(HDF5_FILE):
        write_hdf5(target, shards, output, plan.num_sentences)
    for name in set(shards) & set(target.names()):
        target.remove(name)
    return [target.join(HDF5_FILE)]


def _log_counts(result: EmbedResult, embed_seconds: float) -> None:
    rate = result.num_embedded / embed_seconds if embed_seconds else 0.0
    mlflow.log_metrics(
        {
            "sentences": result.num_sentences,
            "empty_lines": result.num_empty_lines,
            "sentences_embedded": result.num_embedded,
            "tokens_embedded": result.num_tokens,
            "shards_written": result.shards_written,
            "shards_skipped": result.shards_skipped,
            "seconds": result.seconds,
            "sentences_per_second": rate,
        }
    )


def _run_name(input: str) -> str:
    return f"embed-{input.rstrip('/').rsplit('/', 1)[-1] or input}"


def summary_line(result: EmbedResult) -> str:
    """What a run did, in one line."""
    rate = result.num_embedded / result.seconds if result.seconds else 0.0
    empty = f", {result.num_empty_lines:,} empty lines skipped" if result.num_empty_lines else ""
    return (
        f"embedded {result.num_embedded:,} of {result.num_sentences:,} sentences "
        f"({result.num_tokens:,} tokens) into {result.shards_written} new shards, "
        f"{result.shards_skipped} already there{empty}, in {result.seconds:.1f} s "
        f"({rate:,.1f} sentences/s) → {', '.join(result.files[:1])}"
        f"{f' and {len(result.files) - 1} more' if len(result.files) > 1 else ''}"
    )
