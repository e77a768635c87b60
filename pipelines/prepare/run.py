"""One prepare run: the two passes and the shuffle over a pool of tasks, into a dataset output.

A :class:`PrepareRun` carries what every step needs, so the stage calls its steps in order.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import (
    Manifest,
    ShardInfo,
    SplitInfo,
    SplitStats,
    VocabInfo,
    WordTypesInfo,
)
from elmo_core.data.shards import SHARD_FORMAT, SHARD_FORMAT_VERSION, FileStats
from elmo_core.location import sha256_file
from elmo_core.text.type_counts import TypeCounts, split_totals
from elmo_core.text.vocab import (
    BOS_ID,
    EOS_ID,
    UNK_ID,
    Vocabulary,
    build_vocab,
    read_vocab,
    vocab_counts_text,
    vocab_text,
    with_counts,
)
from pipelines.common.console import console_progress
from pipelines.prepare.encode import EncodeTask, encode_file
from pipelines.prepare.inputs import FileCounts, FileTask, count_file
from pipelines.prepare.output import WORD_TYPES_NAME, CountSummary, DatasetOutput, PrepareState
from pipelines.prepare.pool import TaskPool
from pipelines.prepare.shuffle import GatherTask, gather_shard, train_shard_name
from pipelines.prepare.word_types import (
    WordTypesTask,
    build_type_order,
    write_type_order,
    write_word_types,
)

SPLITS = ("train", "heldout")
TYPE_ORDER_NAME = "type_order.arrow"  # in the work directory: pass 2's type tokens
FIRST_SEEN_FILE_SHIFT = 40  # first-seen keys: input file index, then position within the file

R = TypeVar("R")


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


@dataclass(frozen=True)
class CountResult:
    """Pass 1's outcome and where pass 2 reads the type tokens (:meth:`PrepareRun.count`)."""

    summary: CountSummary
    type_tokens: Path  # the type order in the work directory, or word_types.parquet


@dataclass
class PrepareRun:
    """The steps of one prepare run and what they share (see the module doc)."""

    cfg: PrepareConfig
    source: str  # the corpus as recorded in the manifest
    tokenizer: dict[str, Any]  # Tokenizer.describe()
    tasks: list[FileTask]  # one per input file, in input order
    pool: TaskPool
    output: DatasetOutput
    state: PrepareState
    clock: PhaseClock = field(default_factory=PhaseClock)

    def count(self) -> CountResult:
        """Pass 1 over every file, then vocab.txt, its counts and the type order; the recorded
        result instead when its files are still there."""
        previous = self.state.count
        if previous is not None and self.output.has_all(previous.checksums):
            type_tokens = self._type_tokens_file(previous)
            if type_tokens is not None:
                return CountResult(previous, type_tokens)
        totals = _CorpusCounts(len(self.tasks))
        for result in _progress(self.pool.imap(count_file, self.tasks), self.tasks, "count"):
            totals.add(result)
        self.clock.lap("count")
        summary = self._vocabulary(totals)
        self.state.restart_with(summary)
        self.output.save_state(self.state)
        self.clock.lap("vocabulary")
        return CountResult(summary, self.output.work / TYPE_ORDER_NAME)

    def _vocabulary(self, totals: _CorpusCounts) -> CountSummary:
        """The vocabulary and type order of the counts, written; pass 1's summary."""
        cfg, seen = self.cfg, totals.counts.table()
        vocab = (
            with_counts(read_vocab(cfg.vocab_file), seen["token"], seen["count"])
            if cfg.vocab_file
            else build_vocab(
                seen["token"], seen["count"], max_vocab=cfg.max_vocab, min_count=cfg.min_count
            )
        )
        type_order, types = build_type_order(seen, vocab)
        sentences = totals.sentences
        vocab = vocab_with_marker_counts(vocab, sentences["train"], types.num_oov_tokens["train"])
        checksums = {
            "vocab.txt": self.output.write_text("vocab.txt", vocab_text(vocab)),
            "vocab_counts.tsv": self.output.write_text(
                "vocab_counts.tsv", vocab_counts_text(vocab)
            ),
        }
        stats = {
            split: SplitStats(
                **vars(totals.stats[split]), truncated_tokens=types.truncated_tokens[split]
            )
            for split in SPLITS
        }
        return CountSummary(
            stats=stats,
            num_sentences=sentences,
            num_tokens=split_totals(seen),
            num_oov_tokens=types.num_oov_tokens,
            heldout_sentences=totals.heldout_sentences,
            vocab_size=len(vocab),
            num_types=types.num_types,
            imported_vocab=cfg.vocab_file,
            checksums=checksums,
            type_order=write_type_order(type_order, self.output.work / TYPE_ORDER_NAME),
        )

    def _type_tokens_file(self, count: CountSummary) -> Path | None:
        """Where pass 2 can read the type tokens of ``count``: its type order file in the work
        directory (kept until the dataset is complete), else the finished
        ``word_types.parquet``; None when neither is there and pass 1 must run again."""
        order = self.output.work / TYPE_ORDER_NAME
        if order.is_file() and sha256_file(order) == count.type_order:
            return order
        digest = self.state.word_types
        if digest is not None and self.output.has_all({WORD_TYPES_NAME: digest}):
            return self.output.local_root / WORD_TYPES_NAME
        return None

    def encode(self, count: CountResult) -> None:
        """Pass 2: ``word_types.parquet`` if missing, the missing heldout parts, and the training
        rows spilled by shard for the missing training shards."""
        tasks = self._encode_tasks(count)
        word_types = None
        if self.state.word_types is None:
            word_task = WordTypesTask(count.type_tokens, self.output.local_root / WORD_TYPES_NAME)
            word_types = self.pool.submit(write_word_types, word_task)
        results = self.pool.imap(encode_file, tasks)
        for encoded in _progress(results, [task.read for task in tasks], "encode"):
            for info in encoded.heldout_parts:
                self.output.record_shard(self.state, info)
        if word_types is not None:
            self.output.record_word_types(self.state, word_types.get())
        self.clock.lap("encode")

    def _encode_tasks(self, count: CountResult) -> list[EncodeTask]:
        """A task for each file with a heldout part or a training spill still to write."""
        num_shards = num_train_shards(count.summary, self.cfg)
        missing_train = bool(self._missing_train_shards(num_shards))
        parts_of = heldout_part_names(self.tasks, count.summary, self.cfg)
        tasks = []
        for task, parts in zip(self.tasks, parts_of, strict=True):
            spill = self._spill_dir(task)
            want_train = missing_train and task.file.role == "train" and not spill.is_dir()
            want_heldout = any(part not in self.state.shards for part in parts)
            if want_train or want_heldout:
                tasks.append(
                    EncodeTask(
                        task,
                        count.type_tokens,
                        self.output.local_root,
                        parts if want_heldout else [],
                        spill if want_train else None,
                        num_shards,
                    )
                )
        return tasks

    def shuffle(self, count: CountResult) -> None:
        """Gather, shuffle and write each missing training shard; then drop the spills."""
        missing = self._missing_train_shards(num_train_shards(count.summary, self.cfg))
        spills = [self._spill_dir(task) for task in self.tasks if task.file.role == "train"]
        gather = [GatherTask(s, spills, self.output.local_root, self.cfg) for s in missing]
        results = self.pool.imap(gather_shard, gather)
        with console_progress(len(gather), "[prepare] shuffle", unit="shard") as bar:
            for info in results:
                self.output.record_shard(self.state, info)
                bar.update(1)
        shutil.rmtree(self.output.work / "spill", ignore_errors=True)
        self.clock.lap("shuffle")

    def _missing_train_shards(self, num_shards: int) -> list[int]:
        return [s for s in range(num_shards) if train_shard_name(s) not in self.state.shards]

    def _spill_dir(self, task: FileTask) -> Path:
        return self.output.work / "spill" / f"file-{task.file.index:05d}"

    def manifest(self, count: CountResult) -> Manifest:
        """The manifest from the count and the recorded shards (checked against each other)."""
        summary, word_types = count.summary, self.state.word_types
        if word_types is None:
            raise RuntimeError(f"{WORD_TYPES_NAME} was not written")
        parts = heldout_part_names(self.tasks, summary, self.cfg)
        planned = {
            "train": [train_shard_name(s) for s in range(num_train_shards(summary, self.cfg))],
            "heldout": [name for names in parts for name in names],
        }
        splits = {}
        for split in SPLITS:
            shards = [ShardInfo.model_validate(self.state.shards[name]) for name in planned[split]]
            files = [
                task.file.name
                for task, names in zip(self.tasks, parts, strict=True)
                if task.file.role == split or (split == "heldout" and names)
            ]
            splits[split] = split_info(summary, split, shards, files)
        return Manifest(
            shard_format=SHARD_FORMAT,
            shard_format_version=SHARD_FORMAT_VERSION,
            source=self.source,
            format=self.cfg.format,
            tokenizer=self.tokenizer,
            params=self.cfg,
            vocab=VocabInfo(
                size=summary.vocab_size,
                sha256=summary.checksums["vocab.txt"],
                imported_from=summary.imported_vocab,
            ),
            word_types=WordTypesInfo(num_types=summary.num_types, sha256=word_types),
            splits=splits,
            stats=summary.stats["train"] + summary.stats["heldout"],
        )


class _CorpusCounts:
    """The files' pass-1 results summed in the parent, as they arrive (in any order)."""

    def __init__(self, num_files: int) -> None:
        self.counts = TypeCounts()
        self.stats = {split: FileStats() for split in SPLITS}
        self.sentences = {split: 0 for split in SPLITS}
        self.heldout_sentences = [0] * num_files

    def add(self, result: FileCounts) -> None:
        self.stats[result.file.role].add(result.stats)
        self.heldout_sentences[result.file.index] = result.num_sentences["heldout"]
        for split in SPLITS:
            self.sentences[split] += result.num_sentences[split]
        offset = result.file.index << FIRST_SEEN_FILE_SHIFT
        self.counts.add_table(result.counts, first_seen_offset=offset)


def split_info(
    count: CountSummary, split: str, shards: list[ShardInfo], files: list[str]
) -> SplitInfo:
    """A split's manifest entry; its shards must hold the sentences pass 1 counted."""
    num_sentences = count.num_sentences[split]
    if sum(shard.num_sentences for shard in shards) != num_sentences:
        raise RuntimeError(f"{split}: shards disagree with the count; did an input change?")
    num_tokens, num_oov = count.num_tokens[split], count.num_oov_tokens[split]
    return SplitInfo(
        files=files,
        num_sentences=num_sentences,
        num_tokens=num_tokens,
        num_oov_tokens=num_oov,
        oov_rate=num_oov / num_tokens if num_tokens else 0.0,
        stats=count.stats[split],
        shards=shards,
    )


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


def vocab_with_marker_counts(vocab: Vocabulary, num_sentences: int, num_oov: int) -> Vocabulary:
    """Counts for ``vocab_counts.tsv``: markers once per sentence, ``<UNK>`` per OOV token."""
    counts = vocab.counts.copy()
    counts[BOS_ID] = counts[EOS_ID] = num_sentences
    counts[UNK_ID] += num_oov
    return Vocabulary(tokens=vocab.tokens, counts=counts)


def num_train_shards(count: CountSummary, cfg: PrepareConfig) -> int:
    return max(1, math.ceil(count.num_sentences["train"] / cfg.sentences_per_shard))


def _progress(results: Iterable[R], tasks: Sequence[FileTask], desc: str) -> Iterator[R]:
    """Progress over input bytes (rate and ETA), advanced as each file's result arrives."""
    sizes = {task.file.index: task.file.path.stat().st_size for task in tasks}
    with console_progress(sum(sizes.values()), f"[prepare] {desc}") as bar:
        for result in results:
            item = getattr(result, "file", None)
            bar.update(sizes.get(item.index, 0) if item is not None else 0)
            yield result
