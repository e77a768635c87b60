"""The prepare stage: corpus files → a dataset directory of Parquet shards, vocabulary and manifest.

    elmo prepare --corpus PATH_OR_URL --out DIR_OR_URL [--format 1b-benchmark|text] ...
    python -m pipelines.prepare --corpus ... --out ...        # the same main
    prepare(cfg, corpus, out) -> PrepareResult                # what flows call

Two streaming passes over the inputs, parallel over files (``cfg.workers`` processes, one Arrow
thread each, see :mod:`pipelines.prepare.pool`): count word types → vocabulary and the order of
the word types; encode → heldout parts in source order, training rows scattered to shards by a
seeded hash and shuffled within each shard, and beside them the word-type table with its char
ids. The layout and schemas are documented in :mod:`elmo_core.data.shards` and
:mod:`elmo_core.data.manifest`.

Resumption: ``prepare_state.json`` in the output records the config fingerprint, the counting
result, the word-type table and every finished shard with its sha256; re-running the same
command verifies them and redoes only what is missing or corrupt. Everything is written under a
temporary name and renamed; a remote output (``s3://...``, any fsspec URL) is staged locally
and uploaded file by file. The manifest is written last, so its presence means the dataset is
complete.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from tqdm import tqdm

from elmo_core.config import PrepareConfig, resolve_config
from elmo_core.data.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    SplitInfo,
    SplitStats,
    VocabInfo,
    WordTypesInfo,
)
from elmo_core.data.shards import SHARD_FORMAT, SHARD_FORMAT_VERSION, FileStats
from elmo_core.errors import DataError
from elmo_core.files import sha256_file
from elmo_core.text.tokenize import Tokenizer
from elmo_core.text.type_counts import TypeCounts, split_totals
from elmo_core.text.vocab import build_vocab, read_vocab, vocab_counts_text, vocab_text, with_counts
from pipelines.common.cli_runner import run_command
from pipelines.prepare.output import WORD_TYPES_NAME, DatasetOutput, PrepareState
from pipelines.prepare.passes import (
    EncodeTask,
    FileCounts,
    FileTask,
    InputFile,
    WordTypesTask,
    build_type_order,
    count_file,
    encode_file,
    vocab_with_marker_counts,
    write_type_order,
    write_word_types,
)
from pipelines.prepare.pool import TaskPool, task_pool, tune_process
from pipelines.prepare.shuffle import GatherTask, gather_shard, train_shard_name

SPLITS = ("train", "heldout")
TYPE_ORDER_NAME = "type_order.arrow"  # in the work directory: pass 2's type tokens
FIRST_SEEN_FILE_SHIFT = 40  # first-seen keys: input file index, then position within the file


class CorpusInputs(Protocol):
    """What :func:`pipelines.prepare.corpus_sources.locate_corpus` returns (``CorpusFiles``)."""

    @property
    def source(self) -> str: ...
    @property
    def train(self) -> list[Path]: ...
    @property
    def heldout(self) -> list[Path]: ...


@dataclass(frozen=True)
class PrepareResult:
    """Where the dataset is, its manifest, and how much of it this run had to (re)build."""

    dataset: str
    manifest: Manifest
    num_shards_written: int
    num_shards_skipped: int
    seconds: float
    phase_seconds: dict[str, float]  # count, vocabulary, encode, shuffle: where the time went


class PhaseClock:
    """Wall seconds of each named phase of a run, lap by lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the previous lap belongs to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


class CountSummary(BaseModel):
    """Pass-1 outcome, kept in the state record so a resumed run need not count again."""

    stats: dict[str, SplitStats]
    num_sentences: dict[str, int]
    num_tokens: dict[str, int]
    num_oov_tokens: dict[str, int]
    heldout_sentences: list[int]  # per input file, in input order
    vocab_size: int
    num_types: int
    imported_vocab: str | None
    checksums: dict[str, str]  # vocab.txt, vocab_counts.tsv
    type_order: str  # sha256 of the type order file: which word-type table the shards index


def prepare(cfg: PrepareConfig, corpus: str, out: str) -> PrepareResult:
    """Locate ``corpus`` (path, URL, tarball, ``python-docs``) and prepare it into ``out``."""
    from pipelines.common.settings import elmo_home
    from pipelines.prepare.corpus_sources import locate_corpus

    located = locate_corpus(
        corpus,
        cfg.format,
        elmo_home() / "cache" / "corpora",
        sha256=cfg.sha256,
        heldout_files=cfg.heldout_files,
    )
    return prepare_files(cfg, located, out)


def prepare_files(cfg: PrepareConfig, corpus: CorpusInputs, out: str) -> PrepareResult:
    """Prepare already-located local files into the dataset directory ``out``."""
    started = time.perf_counter()
    inputs = plan_inputs(corpus.train, corpus.heldout)
    tokenizer = Tokenizer.for_format(cfg.format).describe()
    by_fraction = cfg.format == "text" and not corpus.heldout and cfg.heldout_fraction > 0
    output = DatasetOutput(out, fingerprint(cfg, corpus.source, tokenizer, inputs))
    spills = output.work / "tokens"
    tasks = [
        FileTask(item, cfg, tokenizer, by_fraction, spills / f"file-{item.index:05d}.arrow")
        for item in inputs
    ]
    state = output.load_state()
    num_skipped = len(state.shards)
    clock = PhaseClock()
    with task_pool(cfg.executor, cfg.workers) as pool:
        count, type_tokens = count_corpus(tasks, cfg, pool, output, state, clock)
        encode_corpus(tasks, count, type_tokens, pool, output, state, clock)
    manifest = build_manifest(cfg, corpus.source, tokenizer, tasks, count, state)
    output.write_text(MANIFEST_NAME, manifest.to_json())
    output.finish()
    return PrepareResult(
        dataset=out,
        manifest=manifest,
        num_shards_written=len(state.shards) - num_skipped,
        num_shards_skipped=num_skipped,
        seconds=time.perf_counter() - started,
        phase_seconds=clock.seconds,
    )


def plan_inputs(train: Sequence[Path], heldout: Sequence[Path]) -> list[InputFile]:
    """Number the inputs (train then heldout) and name them relative to their common root."""
    paths = [Path(path) for path in (*train, *heldout)]
    if not train:
        raise DataError("the corpus has no training files")
    for path in paths:
        if not path.is_file():
            raise DataError("input file not found", path=path)
    root = os.path.commonpath([str(path.parent.absolute()) for path in paths])
    return [
        InputFile(
            index=index,
            path=path,
            name=os.path.relpath(path.absolute(), root).replace(os.sep, "/"),
            role="train" if index < len(train) else "heldout",
        )
        for index, path in enumerate(paths)
    ]


def fingerprint(
    cfg: PrepareConfig, source: str, tokenizer: dict[str, Any], inputs: list[InputFile]
) -> str:
    """What makes two runs the same run: config (less where it runs), tokenizer and input files."""
    files = []
    for item in inputs:
        stat = item.path.stat() if item.path.exists() else None
        files.append([item.name, item.role, stat and stat.st_size, stat and stat.st_mtime_ns])
    payload = {
        "format": [SHARD_FORMAT, SHARD_FORMAT_VERSION],
        "params": cfg.dataset_params(),
        "source": source,
        "tokenizer": tokenizer,
        "inputs": files,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def count_corpus(
    tasks: list[FileTask],
    cfg: PrepareConfig,
    pool: TaskPool,
    output: DatasetOutput,
    state: PrepareState,
    clock: PhaseClock,
) -> tuple[CountSummary, Path]:
    """Pass 1: count types per file in parallel; write vocab.txt, its counts and the type order.

    Returns the count and where pass 2 reads the type tokens (:func:`type_tokens_file`).
    """
    previous = _previous_count(state)
    if previous is not None and output.has_all(previous.checksums):
        type_tokens = type_tokens_file(output, previous, state)
        if type_tokens is not None:
            return previous, type_tokens
    counts = TypeCounts()
    stats = {split: FileStats() for split in SPLITS}
    sentences = {split: 0 for split in SPLITS}
    heldout_sentences = [0] * len(tasks)
    for result in _progress(pool.imap(count_file, tasks), tasks, "count"):
        _add_file_counts(result, counts, stats, sentences, heldout_sentences)
    clock.lap("count")
    seen = counts.table()
    vocab = (
        with_counts(read_vocab(cfg.vocab_file), seen["token"], seen["count"])
        if cfg.vocab_file
        else build_vocab(
            seen["token"], seen["count"], max_vocab=cfg.max_vocab, min_count=cfg.min_count
        )
    )
    type_order, summary = build_type_order(seen, vocab)
    vocab = vocab_with_marker_counts(vocab, sentences["train"], summary.num_oov_tokens["train"])
    checksums = {
        "vocab.txt": output.write_text("vocab.txt", vocab_text(vocab)),
        "vocab_counts.tsv": output.write_text("vocab_counts.tsv", vocab_counts_text(vocab)),
    }
    type_tokens = output.work / TYPE_ORDER_NAME
    count = CountSummary(
        stats={
            split: SplitStats(
                **vars(stats[split]), truncated_tokens=summary.truncated_tokens[split]
            )
            for split in SPLITS
        },
        num_sentences=sentences,
        num_tokens=split_totals(seen),
        num_oov_tokens=summary.num_oov_tokens,
        heldout_sentences=heldout_sentences,
        vocab_size=len(vocab),
        num_types=summary.num_types,
        imported_vocab=cfg.vocab_file,
        checksums=checksums,
        type_order=write_type_order(type_order, type_tokens),
    )
    state.restart_with(count)
    output.save_state(state)
    clock.lap("vocabulary")
    return count, type_tokens


def _previous_count(state: PrepareState) -> CountSummary | None:
    """The recorded counting result, if any (one recorded by an older prepare is recounted)."""
    try:
        return None if state.count is None else CountSummary.model_validate(state.count)
    except ValidationError:
        return None


def type_tokens_file(
    output: DatasetOutput, count: CountSummary, state: PrepareState
) -> Path | None:
    """Where pass 2 can read the type tokens of ``count``: its type order file in the work
    directory (kept until the dataset is complete), else the finished ``word_types.parquet``;
    None when neither is there and pass 1 must run again."""
    order = output.work / TYPE_ORDER_NAME
    if order.is_file() and sha256_file(order) == count.type_order:
        return order
    if state.word_types is not None and output.has_all({WORD_TYPES_NAME: state.word_types}):
        return output.local_root / WORD_TYPES_NAME
    return None


def _add_file_counts(
    result: FileCounts,
    counts: TypeCounts,
    stats: dict[str, FileStats],
    sentences: dict[str, int],
    heldout_sentences: list[int],
) -> None:
    stats[result.file.role].add(result.stats)
    heldout_sentences[result.file.index] = result.num_sentences["heldout"]
    for split in SPLITS:
        sentences[split] += result.num_sentences[split]
    counts.add_table(result.counts, first_seen_offset=result.file.index << FIRST_SEEN_FILE_SHIFT)


def heldout_part_names(
    tasks: list[FileTask], count: CountSummary, cfg: PrepareConfig
) -> list[list[str]]:
    """Per input file, the names of its heldout parts (numbered across files in input order)."""
    names, next_part = [], 0
    for task in tasks:
        num = math.ceil(count.heldout_sentences[task.file.index] / cfg.sentences_per_shard)
        names.append(
            [f"heldout/part-{part:05d}.parquet" for part in range(next_part, next_part + num)]
        )
        next_part += num
    return names


def num_train_shards(count: CountSummary, cfg: PrepareConfig) -> int:
    return max(1, math.ceil(count.num_sentences["train"] / cfg.sentences_per_shard))


def encode_corpus(
    tasks: list[FileTask],
    count: CountSummary,
    type_tokens: Path,
    pool: TaskPool,
    output: DatasetOutput,
    state: PrepareState,
    clock: PhaseClock,
) -> None:
    """Pass 2: write word_types.parquet if missing, missing heldout parts and training shards
    (scatter, then shuffle-gather)."""
    cfg = tasks[0].cfg
    num_shards = num_train_shards(count, cfg)
    missing_train = [s for s in range(num_shards) if train_shard_name(s) not in state.shards]
    spill_root = output.work / "spill"
    spill_dirs = [spill_root / f"file-{t.file.index:05d}" for t in tasks if t.file.role == "train"]
    encode_tasks = []
    for task, parts in zip(tasks, heldout_part_names(tasks, count, cfg), strict=True):
        spill = spill_root / f"file-{task.file.index:05d}"
        want_train = bool(missing_train) and task.file.role == "train" and not spill.is_dir()
        want_heldout = any(part not in state.shards for part in parts)
        if want_train or want_heldout:
            encode_tasks.append(
                EncodeTask(
                    task,
                    type_tokens,
                    output.local_root,
                    parts if want_heldout else [],
                    spill if want_train else None,
                    num_shards,
                )
            )
    word_types = None
    if state.word_types is None:
        word_task = WordTypesTask(type_tokens, output.local_root / WORD_TYPES_NAME)
        word_types = pool.submit(write_word_types, word_task)
    for encoded in _progress(
        pool.imap(encode_file, encode_tasks), [t.read for t in encode_tasks], "encode"
    ):
        for info in encoded.heldout_parts:
            output.record_shard(state, info)
    if word_types is not None:
        output.record_word_types(state, word_types.get())
    clock.lap("encode")
    gather = [GatherTask(s, spill_dirs, output.local_root, cfg) for s in missing_train]
    for info in tqdm(
        pool.imap(gather_shard, gather),
        total=len(gather),
        desc="shuffle",
        unit="shard",
        disable=None,
    ):
        output.record_shard(state, info)
    shutil.rmtree(spill_root, ignore_errors=True)
    clock.lap("shuffle")


def build_manifest(
    cfg: PrepareConfig,
    source: str,
    tokenizer: dict[str, Any],
    tasks: list[FileTask],
    count: CountSummary,
    state: PrepareState,
) -> Manifest:
    """The manifest from the count summary and the recorded shards (checked against each other)."""
    if state.word_types is None:
        raise RuntimeError(f"{WORD_TYPES_NAME} was not written")
    parts = heldout_part_names(tasks, count, cfg)
    planned = {
        "train": [train_shard_name(s) for s in range(num_train_shards(count, cfg))],
        "heldout": [name for names in parts for name in names],
    }
    splits = {}
    for split in SPLITS:
        shards = [ShardInfo.model_validate(state.shards[name]) for name in planned[split]]
        num_sentences = count.num_sentences[split]
        if sum(shard.num_sentences for shard in shards) != num_sentences:
            raise RuntimeError(f"{split}: shards disagree with the count; did an input change?")
        files = [
            t.file.name
            for t, p in zip(tasks, parts, strict=True)
            if t.file.role == split or (split == "heldout" and p)
        ]
        num_tokens, num_oov = count.num_tokens[split], count.num_oov_tokens[split]
        splits[split] = SplitInfo(
            files=files,
            num_sentences=num_sentences,
            num_tokens=num_tokens,
            num_oov_tokens=num_oov,
            oov_rate=num_oov / num_tokens if num_tokens else 0.0,
            stats=count.stats[split],
            shards=shards,
        )
    return Manifest(
        shard_format=SHARD_FORMAT,
        shard_format_version=SHARD_FORMAT_VERSION,
        source=source,
        format=cfg.format,
        tokenizer=tokenizer,
        params=cfg,
        vocab=VocabInfo(
            size=count.vocab_size,
            sha256=count.checksums["vocab.txt"],
            imported_from=count.imported_vocab,
        ),
        word_types=WordTypesInfo(num_types=count.num_types, sha256=state.word_types),
        splits=splits,
        stats=count.stats["train"] + count.stats["heldout"],
    )


R = TypeVar("R")


def _progress(results: Iterable[R], tasks: Sequence[FileTask], desc: str) -> Iterator[R]:
    """tqdm over input bytes (rate and ETA), advanced as each file's result arrives."""
    sizes = {task.file.index: task.file.path.stat().st_size for task in tasks}
    with tqdm(total=sum(sizes.values()), desc=desc, unit="B", unit_scale=True, disable=None) as bar:
        for result in results:
            item = getattr(result, "file", None)
            bar.update(sizes.get(item.index, 0) if item is not None else 0)
            yield result


# --- command line --------------------------------------------------------------------------------


def prepare_command(
    corpus: Annotated[str, typer.Option(help="corpus path or URL, or 'python-docs'")],
    out: Annotated[str, typer.Option(help="dataset directory or fsspec URL (s3://...)")],
    format: Annotated[str | None, typer.Option(help="1b-benchmark | text")] = None,
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
) -> None:
    """Prepare a corpus into Parquet shards, vocab.txt and manifest.json."""
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
    result = prepare(cfg, corpus, out)
    for name, split in result.manifest.splits.items():
        typer.echo(
            f"{name}: {split.num_sentences} sentences, {split.num_tokens} tokens, "
            f"OOV {split.oov_rate:.4%}, {len(split.shards)} shards"
        )
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
