"""Adaptation on real data: accuracy with and without ELMo, and what the activation cache saves.

    python benchmarks/bench_adapt.py [--data-root ../shared/data] [--bilm PATH_OR_URI]
        [--pretrain-steps 200] [--max-train 2000] [--epochs 3] [--speed-sentences 256]

Without ``--bilm``, a ``small`` biLM (2x1024_128_2048cnn_1xhighway) is pretrained first with the
real stages: ``prepare`` over PTB train + the plain-text books (PTB valid as heldout), then
``train`` (Ray Train, one CPU worker) for ``--pretrain-steps`` steps of 16 × 20 tokens — minutes on
a CPU, so a weak LM; pass ``--bilm`` to adapt a better one. Then, on the same biLM:

* accuracy — POS tagging on UD English EWT (UPOS) and TREC question type (coarse labels), the
  ELMo model against the baseline (same head over task-trained word embeddings, no ELMo; no
  pretrained word vectors offline), training capped at ``--max-train`` sentences;
* cache speed-up — one training epoch of the ELMo POS model over ``--speed-sentences`` sentences
  with the default head: baseline = the biLM run live over the epoch's batches (what an uncached
  epoch computes) + the training step; candidate = the same step reading the memory-mapped
  cache. Live and cached activations are checked to agree (float16 rounding) before timing.

Skips cleanly (exit 0) when the data root is absent. Last line: one JSON object with
``cache_ratio = uncached_epoch_seconds / cached_epoch_seconds`` and the ELMo gains.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from elmo_core.config import PrepareConfig
from elmo_core.tasks import TaskConfig
from elmo_core.tasks.activation_cache import ActivationCache, live_activations
from elmo_core.tasks.readers import AnyDataset
from elmo_core.tasks.task_model import example_sentences
from elmo_core.tasks.trainer import BASELINE, TaskSplit, train_task
from pipelines.adapt import cache_splits, read_splits
from pipelines.bilm_source import load_bilm_source, resolve_bilm
from pipelines.corpus_sources import CorpusFiles
from pipelines.prepare import prepare_files

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
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, help="scratch dir (default: a temporary one)")
    return parser.parse_args()


def pretrain(data_root: Path, steps: int, work: Path) -> str:
    """prepare (PTB train + books, PTB valid heldout) → train ``small`` for ``steps`` steps."""
    from pipelines.train import train
    from pipelines.train_config import resolve_train_config

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


def cache_speedup(
    bilm: torch.nn.Module, task: TaskConfig, args: argparse.Namespace, cache_dir: Path
) -> dict[str, float]:
    """Median epoch seconds with the cache, and with the biLM run live over the same batches."""
    train = capped(read_splits(task), args)["train"]
    train = replace(train, examples=train.examples[: args.speed_sentences])
    sentences = example_sentences(train.examples)
    cached = ActivationCache(cache_dir).get_or_build(bilm, sentences, progress=False)
    live, _ = live_activations(bilm, sentences[:8])
    stored, _ = cached.batch(np.arange(8))
    max_diff = float((live - stored).abs().max())
    assert max_diff < 0.05, f"cached activations differ from live ones by {max_diff}"
    one_epoch = task.model_copy(update={"training": task.training.model_copy(update={"epochs": 1})})
    split = TaskSplit(train, cached)
    train_task(one_epoch, split, None, None, True)  # warm-up
    cached_times, live_times = [], []
    order = np.random.default_rng(0).permutation(len(sentences))
    batch_size = one_epoch.training.batch_size
    for _ in range(args.repeats):
        started = time.perf_counter()
        train_task(one_epoch, split, None, None, True)
        cached_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        for start in range(0, len(order), batch_size):
            live_activations(bilm, [sentences[i] for i in order[start : start + batch_size]])
        live_times.append(time.perf_counter() - started)
    cached_s = statistics.median(cached_times)
    uncached_s = cached_s + statistics.median(live_times)
    return {"cached_s": cached_s, "uncached_s": uncached_s, "max_diff": max_diff}


def main() -> int:
    args = parse_args()
    if not (args.data_root / "ud_ewt").is_dir() or not (args.data_root / "cls").is_dir():
        print(f"skipped: no ud_ewt/ and cls/ under {args.data_root}")
        print(json.dumps({"skipped": True}))
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench-adapt-") as scratch:
        work = args.work or Path(scratch)
        started = time.perf_counter()
        source = args.bilm or pretrain(args.data_root, args.pretrain_steps, work)
        pretrain_s = 0.0 if args.bilm else time.perf_counter() - started
        bilm = load_bilm_source(resolve_bilm(source), work / "bilm").bilm
        tasks = task_configs(args.data_root, args, work)
        speed = cache_speedup(bilm, tasks[0], args, work / "cache")
        rows = accuracy_rows(bilm, tasks, args, work / "cache")
    print(f"biLM: {source} (pretraining {pretrain_s:.0f} s, {args.pretrain_steps} steps)")
    print(f"baseline: {BASELINE}")
    print(f"{'task':<12} {'baseline acc':>12} {'ELMo acc':>9} {'gain':>7}")
    for name, base, elmo in rows:
        print(f"{name:<12} {base:>12.4f} {elmo:>9.4f} {elmo - base:>+7.4f}")
    ratio = speed["uncached_s"] / speed["cached_s"]
    print(
        f"POS epoch over {args.speed_sentences} sentences: uncached {speed['uncached_s']:.2f} s, "
        f"cached {speed['cached_s']:.2f} s (live vs cached max diff {speed['max_diff']:.1e})"
    )
    summary = {"cache_ratio": round(ratio, 2), "baseline_seconds": speed["uncached_s"]}
    summary |= {"candidate_seconds": speed["cached_s"]}
    summary |= {f"gain_{name}": round(elmo - base, 4) for name, base, elmo in rows}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
