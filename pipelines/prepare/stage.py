"""The prepare stage: corpus files → a dataset directory of Parquet shards, vocabulary and manifest.

Two streaming passes in parallel: count word types → vocabulary; encode → heldout parts and
shuffled training shards. The manifest is written last: its presence means the dataset is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import MANIFEST_NAME, Manifest
from elmo_core.data.shards import SHARD_FORMAT, SHARD_FORMAT_VERSION
from elmo_core.errors import DataError
from elmo_core.location import absolute_location
from elmo_core.text.tokenize import Tokenizer
from pipelines.common.handoff import DATASET_TAG
from pipelines.prepare.inputs import FileTask, SourceFile
from pipelines.prepare.output import CountSummary, DatasetOutput
from pipelines.prepare.pool import task_pool
from pipelines.prepare.run import PrepareRun


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


def prepare(
    cfg: PrepareConfig,
    corpus: str,
    out: str,
    *,
    overwrite: bool = False,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> PrepareResult:
    """Locate ``corpus`` (path, URL, tarball, ``python-docs``) and prepare it into ``out``;
    ``overwrite`` replaces another dataset found there. Recorded as the stage's MLflow run (a
    child of ``parent_run_id``'s, inside a flow)."""
    from pipelines.common.settings import elmo_home
    from pipelines.prepare.corpus_sources import locate_corpus
    from pipelines.tracking.stage_runs import stage_run

    dataset = absolute_location(out)
    all_tags = {DATASET_TAG: dataset, **(tags or {})}
    name = _run_name(dataset)
    with stage_run("prepare", run_name=name, parent_run_id=parent_run_id, tags=all_tags):
        located = locate_corpus(
            corpus,
            cfg.format,
            elmo_home() / "cache" / "corpora",
            sha256=cfg.sha256,
            heldout_files=cfg.heldout_files,
        )
        result = prepare_files(cfg, located, dataset, overwrite=overwrite)
        shards = (result.num_shards_written, result.num_shards_skipped)
        log_prepared(cfg, corpus, dataset, result.manifest, result.phase_seconds, shards)
    return result


def prepare_run_id(dataset: str) -> str | None:
    """The id of the prepare run that made ``dataset`` (the newest, where it was made again),
    None where none did (a dataset made elsewhere): what a flow's summary links."""
    from pipelines.tracking.stage_runs import find_run

    run = find_run(_run_name(absolute_location(dataset)), "prepare")
    return None if run is None else run.info.run_id


def _run_name(dataset: str) -> str:
    from pipelines.tracking.stage_runs import location_name, stage_run_name

    return stage_run_name("prepare", location_name(dataset))


def prepare_files(
    cfg: PrepareConfig, corpus: CorpusInputs, out: str, *, overwrite: bool = False
) -> PrepareResult:
    """Prepare already-located local files into the dataset directory ``out``."""
    started = time.perf_counter()
    inputs = plan_inputs(corpus.train, corpus.heldout)
    tokenizer = Tokenizer.for_format(cfg.format, cfg.tokenizer.lang).describe()
    output = DatasetOutput(out, fingerprint(cfg, corpus.source, tokenizer, inputs))
    output.claim(overwrite)
    state = output.load_state()
    num_skipped = len(state.shards)
    tasks = file_tasks(cfg, inputs, tokenizer, output, by_fraction=not corpus.heldout)
    with task_pool(cfg.executor, cfg.workers) as pool:
        run = PrepareRun(cfg, corpus.source, tokenizer, tasks, pool, output, state)
        count = run.count()
        warn_replaced_bytes(count.summary)
        run.encode(count)
        run.shuffle(count)
    manifest = run.manifest(count)
    output.remove_unlisted_shards(manifest)
    output.write_text(MANIFEST_NAME, manifest.to_json())
    output.finish()
    return PrepareResult(
        dataset=out,
        manifest=manifest,
        num_shards_written=len(state.shards) - num_skipped,
        num_shards_skipped=num_skipped,
        seconds=time.perf_counter() - started,
        phase_seconds=run.clock.seconds,
    )


def log_prepared(
    cfg: PrepareConfig,
    corpus: str,
    dataset: str,
    manifest: Manifest,
    seconds: dict[str, float],
    num_shards: tuple[int, int],
) -> None:
    """Log into the active run: the config, the corpus, per-split sizes, the vocabulary, the
    phases' seconds and the shards (written, reused) of a finished prepare. A split's
    ``_tokens`` are its words, as the tokenizer split them (the evaluate run's
    ``_predicted_tokens`` add one end per sentence). The dataset it wrote is the run's input in
    MLflow's Datasets panel (the same digest as the runs that read it), its manifest an
    artifact."""
    import mlflow

    from pipelines.tracking.datasets import log_dataset
    from pipelines.tracking.stage_runs import DESCRIPTION_TAG, log_config

    log_config(cfg, "prepare_config.json")
    mlflow.log_params({"corpus": corpus, "dataset": dataset})
    metrics = {
        "vocabulary_size": float(manifest.vocab.size),
        "word_types": float(manifest.word_types.num_types),
        "shards_written": float(num_shards[0]),
        "shards_reused": float(num_shards[1]),
        **{f"seconds_{phase}": value for phase, value in seconds.items()},
    }
    for name, split in manifest.splits.items():
        metrics |= {
            f"{name}_sentences": float(split.num_sentences),
            f"{name}_tokens": float(split.num_tokens),
            f"{name}_oov_rate": split.oov_rate,
            f"{name}_invalid_utf8_replacements": float(split.stats.invalid_utf8_replacements),
        }
    mlflow.log_metrics(metrics)
    mlflow.log_text(manifest.to_json(), MANIFEST_NAME)
    log_dataset(dataset, "prepared")
    vocabulary = (
        f"vocabulary {manifest.vocab.size:,} of {manifest.word_types.num_types:,} word types"
    )
    lines = [f"Prepared {corpus} into {dataset}.", *split_lines(manifest), vocabulary]
    mlflow.set_tag(DESCRIPTION_TAG, "\n\n".join(lines))


def split_lines(manifest: Manifest) -> list[str]:
    """``train: 150,651 sentences, 1,510,888 tokens, OOV 0.03%, 1 shard``, one per split (OOV
    to two decimals, as the flow's log says it)."""
    return [
        f"{name}: {split.num_sentences:,} sentences, {split.num_tokens:,} tokens, "
        f"OOV {split.oov_rate:.2%}, {len(split.shards)} shard{'s' * (len(split.shards) != 1)}"
        for name, split in manifest.splits.items()
    ]


def warn_replaced_bytes(summary: CountSummary) -> None:
    """One line on the console when invalid UTF-8 was replaced: the manifest alone keeps the count,
    and nobody reads a manifest to learn that their corpus has a wrong encoding."""
    replaced = sum(stats.invalid_utf8_replacements for stats in summary.stats.values())
    if replaced:
        print(
            f"[prepare] warning: {replaced:,} invalid UTF-8 byte sequence(s) in the corpus were "
            "replaced by U+FFFD; --set on_invalid_utf8=fail stops at the first one, naming its "
            "file and line",
            file=sys.stderr,
        )


def plan_inputs(train: Sequence[Path], heldout: Sequence[Path]) -> list[SourceFile]:
    """Number the inputs (train then heldout) and name them relative to their common root."""
    paths = [Path(path) for path in (*train, *heldout)]
    if not train:
        raise DataError("the corpus has no training files")
    for path in paths:
        if not path.is_file():
            raise DataError("input file not found", path=path)
    root = os.path.commonpath([str(path.parent.absolute()) for path in paths])
    return [
        SourceFile(
            index=index,
            path=path,
            name=os.path.relpath(path.absolute(), root).replace(os.sep, "/"),
            role="train" if index < len(train) else "heldout",
        )
        for index, path in enumerate(paths)
    ]


def file_tasks(
    cfg: PrepareConfig,
    inputs: list[SourceFile],
    tokenizer: dict[str, Any],
    output: DatasetOutput,
    by_fraction: bool,
) -> list[FileTask]:
    """How each file is read in both passes; ``by_fraction``: the corpus has no heldout files,
    so a seeded fraction of its sentences goes to heldout (the 1B Word Benchmark brings its own
    heldout files and never splits its training files)."""
    by_fraction = by_fraction and cfg.format != "1b-benchmark" and cfg.heldout_fraction > 0
    spills = output.work / "tokens"
    return [
        FileTask(item, cfg, tokenizer, by_fraction, spills / f"file-{item.index:05d}.arrow")
        for item in inputs
    ]


def fingerprint(
    cfg: PrepareConfig, source: str, tokenizer: dict[str, Any], inputs: list[SourceFile]
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
