"""Adaptation on real data: accuracy with and without ELMo, and what the activation cache saves.

    python -m benchmarks.bench_adapt [--data-root ../shared/data] [--bilm PATH_OR_URI]
        [--only all|speed|accuracy] [--speed-preset small] [--speed-sentences 256]
        [--pretrain-steps 200] [--max-train 2000] [--epochs 3] [--threads 1]

Speed: one epoch's training loop of the ELMo POS model, the biLM run live for every batch (the
baseline) against the activation cache. Accuracy: UD EWT UPOS and TREC with ELMo against the same
head over task-trained word embeddings (no ``--bilm``: a ``small`` one is pretrained first). Skips
without the data root. Last line: one JSON object, ``cache_ratio`` (uncached / cached seconds) and
the gains; results: benchmarks/results/bench_adapt_ptb_small-2026-11-21.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import check_agreement, print_summary, time_in_turn
from elmo_core.config import PrepareConfig
from elmo_core.model.bilm import BiLM
from elmo_core.presets import model_preset
from elmo_core.tasks import TaskConfig
from elmo_core.tasks.activation_cache import ActivationCache, live_activations
from elmo_core.tasks.readers import AnyDataset
from elmo_core.tasks.task_model import EncodedSplit, example_sentences
from elmo_core.tasks.trainer import (
    BASELINE,
    TaskSplit,
    build_task_model,
    epoch_batches,
    train_epoch,
    train_task,
)
from pipelines.common.task_data import cache_splits, read_splits
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files
from pipelines.serving.bilm_loader import load_bilm, resolve_bilm

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--bilm", help="model/checkpoint/run dir or models:/ URI (skip pretrain)")
    parser.add_argument("--pretrain-steps", type=int, default=200)
    parser.add_argument("--max-train", type=int, default=2000, help="training sentences per task")
    parser.add_argument("--max-eval", type=int, default=1000, help="dev/test sentences per task")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--speed-sentences", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="2 on a loaded 2-core box oversubscribes"
    )
    parser.add_argument("--speed-preset", default="small", help="biLM size of the cache timing")
    parser.add_argument("--only", choices=("all", "speed", "accuracy"), default="all")
    parser.add_argument("--work", type=Path, help="scratch dir (default: a temporary one)")
    return parser.parse_args()


def pretrain(data_root: Path, steps: int, work: Path) -> str:
    """prepare (PTB train + books, PTB valid heldout) → train ``small`` for ``steps`` steps."""
    from pipelines.train.job_config import resolve_train_config
    from pipelines.train.stage import train

    books = sorted(p for p in (data_root / "text").rglob("*.txt") if p.is_file())
    corpus = CorpusFiles(
        str(data_root), "text", [data_root / "ptb" / "ptb.train.txt", *books],
        [data_root / "ptb" / "ptb.valid.txt"],
    )  # fmt: skip
    dataset = str(work / "dataset")
    prepare_files(PrepareConfig(format="text", max_vocab=50_000), corpus, dataset)
    overrides = [
        f"train.max_steps={steps}",
        "train.batch_size=16",
        f"train.validate_every={steps}",
        f"train.checkpoint_every={steps}",
        "train.validation_sentences=200",
        "run.cpus_per_worker=2",
        f"run.storage_path={work / 'runs'}",
    ]
    result = train(resolve_train_config("small", None, overrides), dataset)
    return result.model_dir


def task_configs(data_root: Path, args: argparse.Namespace, work: Path) -> list[TaskConfig]:
    training = {"epochs": args.epochs, "batch_size": 32, "patience": None}
    ud = data_root / "ud_ewt"
    pos = {"name": "pos-ud-ewt", "type": "tagging", "format": "conllu"}
    pos |= {f: ud / f"en_ewt-ud-{f}.conllu" for f in ("train", "dev", "test")}
    trec = {"name": "trec", "type": "classification", "format": "label_text"}
    for split in ("train", "test"):  # the TREC files are Latin-1; our readers read UTF-8
        source, copy = data_root / "cls" / f"TREC.{split}.all", work / f"TREC.{split}.all"
        copy.write_text(source.read_text(encoding="latin-1"), encoding="utf-8")
        trec[split] = str(copy)
    return [TaskConfig.model_validate(c | {"training": training}) for c in (pos, trec)]


def capped(datasets: dict[str, AnyDataset], args: argparse.Namespace) -> dict[str, AnyDataset]:
    """Train capped at ``max_train``, dev/test at ``max_eval`` sentences (taken from the start)."""
    limit = {"train": args.max_train, "dev": args.max_eval, "test": args.max_eval}
    return {name: replace(d, examples=d.examples[: limit[name]]) for name, d in datasets.items()}


def coarse_trec(datasets: dict[str, AnyDataset]) -> dict[str, AnyDataset]:
    """TREC ``DESC:manner`` → ``DESC`` (the 6 coarse classes)."""
    return {
        name: replace(d, examples=[replace(e, label=e.label.split(":")[0]) for e in d.examples])
        for name, d in datasets.items()
    }


def accuracy_rows(
    bilm: torch.nn.Module, tasks: list[TaskConfig], args: argparse.Namespace, cache_dir: Path
) -> list[tuple[str, float, float]]:
    rows = []
    for task in tasks:
        datasets = capped(read_splits(task), args)
        if task.name == "trec":
            datasets = coarse_trec(datasets)
        every_label = sorted(set().union(*(d.labels() for d in datasets.values())))
        task = task.model_copy(update={"labels": every_label})  # capped splits may lack some
        splits = cache_splits(bilm, datasets, cache_dir)
        elmo = train_task(task, splits["train"], splits.get("dev"), splits["test"], True)
        base = train_task(task, splits["train"], splits.get("dev"), splits["test"], False)
        rows.append((task.name, base.test_metrics["accuracy"], elmo.test_metrics["accuracy"]))
    return rows


class LiveLayers:
    """Stands in for the cache in an encoded split: every batch runs the frozen biLM now.

    That is what an epoch without the cache computes, so the uncached and cached epochs are the
    same ``train_epoch`` call over the same batches and differ only in where the layers come from.
    """

    def __init__(self, bilm: torch.nn.Module, sentences: list[list[str]]) -> None:
        self.bilm, self.sentences = bilm, sentences

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        layers, mask = live_activations(self.bilm, [self.sentences[i] for i in indices])
        return layers.cpu(), mask.cpu()  # (L, B, T, D), (B, T)


def cache_speedup(
    bilm: torch.nn.Module, task: TaskConfig, args: argparse.Namespace, cache_dir: Path
) -> dict[str, float]:
    """Median seconds of one training epoch (the loop alone) reading the cache, or the biLM live.

    Vocabulary, model and split encoding are built once outside the timed region: they are the
    same work with or without the cache.
    """
    train = capped(read_splits(task), args)["train"]
    train = replace(train, examples=train.examples[: args.speed_sentences])
    sentences = example_sentences(train.examples)
    cached = ActivationCache(cache_dir).get_or_build(bilm, sentences, progress=False)
    live = LiveLayers(bilm, sentences)
    model, splits = build_task_model(task, TaskSplit(train, cached), None, None, True)
    cached_split = splits["train"]
    live_split = replace(cached_split, activations=live)
    check = np.arange(min(8, len(sentences)))
    max_diff = float((live.batch(check)[0] - cached.batch(check)[0]).abs().max())
    check_agreement({"max_diff": max_diff}, 0.05, "cached and live activations")
    optimizer = torch.optim.Adam(model.parameters(), lr=task.training.lr)
    settings, shuffler = task.training, np.random.default_rng(0)
    batches = epoch_batches(cached_split, settings.batch_size, settings.batches, shuffler)

    def epoch(split: EncodedSplit) -> Callable[[], float]:
        return lambda: train_epoch(model, optimizer, split, batches)

    # One warm-up epoch each (both paths share the head's kernels), then in turn.
    runs = {"cached": epoch(cached_split), "uncached": epoch(live_split)}
    seconds = time_in_turn(runs, args.repeats)
    return {
        "cached_s": seconds["cached"],
        "uncached_s": seconds["uncached"],
        "max_diff": max_diff,
    }


def speed_part(args: argparse.Namespace, task: TaskConfig, work: Path) -> dict[str, object]:
    """The cache speed-up on a random-init ``--speed-preset`` biLM: the cost needs no weights."""
    bilm = BiLM(model_preset(args.speed_preset))
    speed = cache_speedup(bilm, task, args, work / "speed-cache")
    ratio = speed["uncached_s"] / speed["cached_s"]
    print(
        f"POS training epoch over {args.speed_sentences} sentences, {args.speed_preset} biLM "
        f"(random init), default head: biLM live {speed['uncached_s']:.3f} s, cached "
        f"{speed['cached_s']:.3f} s → {ratio:.1f}x "
        f"(live vs cached max diff {speed['max_diff']:.1e})"
    )
    return {
        "speed_preset": args.speed_preset,
        "cache_ratio": round(ratio, 2),
        "baseline_seconds": round(speed["uncached_s"], 4),
        "candidate_seconds": round(speed["cached_s"], 4),
    }


def accuracy_part(
    args: argparse.Namespace, tasks: list[TaskConfig], work: Path
) -> dict[str, object]:
    """ELMo against the baseline on every task, with ``--bilm`` or a freshly pretrained one."""
    started = time.perf_counter()
    source = args.bilm or pretrain(args.data_root, args.pretrain_steps, work)
    pretrain_s = 0.0 if args.bilm else time.perf_counter() - started
    bilm = load_bilm(resolve_bilm(source), work / "bilm").bilm
    rows = accuracy_rows(bilm, tasks, args, work / "cache")
    print(f"biLM: {source} (pretraining here: {pretrain_s:.0f} s)")
    print(f"baseline: {BASELINE}")
    print(f"{'task':<12} {'baseline acc':>12} {'ELMo acc':>9} {'gain':>7}")
    for name, base, elmo in rows:
        print(f"{name:<12} {base:>12.4f} {elmo:>9.4f} {elmo - base:>+7.4f}")
    summary: dict[str, object] = {"bilm": source}
    for name, base, elmo in rows:
        summary |= {f"baseline_{name}": round(base, 4), f"elmo_{name}": round(elmo, 4)}
        summary[f"gain_{name}"] = round(elmo - base, 4)
    return summary


def main() -> int:
    args = parse_args()
    if not (args.data_root / "ud_ewt").is_dir() or not (args.data_root / "cls").is_dir():
        print(f"skipped: no ud_ewt/ and cls/ under {args.data_root}")
        print_summary({"skipped": True})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    summary: dict[str, object] = {"benchmark": "adapt"}
    with tempfile.TemporaryDirectory(prefix="bench-adapt-") as scratch:
        work = args.work or Path(scratch)
        tasks = task_configs(args.data_root, args, work)
        if args.only in ("all", "speed"):
            summary |= speed_part(args, tasks[0], work)
        if args.only in ("all", "accuracy"):
            summary |= accuracy_part(args, tasks, work)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
