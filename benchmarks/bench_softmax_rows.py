"""How many softmax rows data-parallel workers touch a step, on real text: the input that decides
how the softmax's row gradients should travel between them (``infra/device/scaling_model.py``).

    python -m benchmarks.bench_softmax_rows [--rows 128,1024] [--workers 8,16] [--steps 6]
    python -m benchmarks.bench_softmax_rows --smoke   # the bundled corpus, tiny sizes

PTB's training text and the books under ``--data-root`` (real Zipf words; about 4M tokens)
are prepared as a dataset and read by each worker's own training loader (its shard of the text,
both directions, window 20), which draws ``original``'s candidates (8,192 of 793,471 rows a
direction, log-uniform, per rank) as in training. Printed per rows and workers, as the mean over
steps: the rows one worker touches (its targets and both draws; distinct), the static bound it
pads them to, the distinct rows of all workers together, and the same with one candidate draw
shared by every worker. Last line: one JSON object.
Results: benchmarks/results/bench_softmax_rows-2026-11-28.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_data_path import ORIGINAL_DRAW
from benchmarks.harness import print_summary
from elmo_core.config import PrepareConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.sampler import touched_rows
from elmo_core.training.batches import CandidateSpec, StepBatch, StepBatches, StreamSpec
from elmo_core.training.gradient_exchange import softmax_rows_bound
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files

REPO = Path(__file__).resolve().parents[1]
UNROLL = 20


def prepare_text(data_root: Path, out: Path) -> str:
    """PTB's training text and the books, prepared as one dataset."""
    books = sorted(p for p in (data_root / "text").rglob("*.txt") if p.is_file())
    files = CorpusFiles(
        str(data_root), "text", [data_root / "ptb" / "ptb.train.txt", *books],
        [data_root / "ptb" / "ptb.valid.txt"],
    )  # fmt: skip
    prepare_files(PrepareConfig(format="text"), files, str(out))
    return str(out)


def worker_steps(
    dataset: str, rows: int, workers: int, steps: int, draw: CandidateSpec
) -> list[list[StepBatch]]:
    """``steps`` batches of each of ``workers`` ranks, as each rank's loader makes them."""
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    ranks = []
    for rank in range(workers):
        specs = tuple(
            StreamSpec(dataset, rows, UNROLL, rank, workers, reverse, seed, candidates=draw)
            for reverse, seed in ((False, 1), (True, 2))
        )
        with StepBatches(specs, manifest, table, workers=0, pin_memory=False) as batches:
            ranks.append([next(batches) for _ in range(steps)])
    return ranks


def count(ranks: list[list[StepBatch]], rows: int, draw: CandidateSpec) -> dict[str, float]:
    """Mean rows a step: one worker's, its padded bound, all workers', all with a shared draw."""
    one, every, shared, targets = [], [], [], []
    for batches in zip(*ranks, strict=True):  # one step of every rank
        touched = [
            batch.softmax_rows.numpy() for batch in batches if batch.softmax_rows is not None
        ]
        one += [len(rows_) for rows_ in touched]
        every.append(len(np.unique(np.concatenate(touched))))
        words = np.concatenate(
            [
                w.targets.numpy().ravel()
                for batch in batches
                for w in (batch.forward, batch.backward)
            ]
        )
        first = batches[0]
        assert first.forward.candidates is not None and first.backward.candidates is not None
        drawn = (first.forward.candidates.ids.numpy(), first.backward.candidates.ids.numpy())
        targets.append(len(np.unique(np.maximum(words, 0))))
        shared.append(len(touched_rows(words, *drawn)))
    return {
        "worker": statistics.mean(one),
        "bound": softmax_rows_bound(draw.vocab_size, rows, UNROLL, draw.num_samples),
        "all": statistics.mean(every),
        "all_shared_draw": statistics.mean(shared),
        "all_targets": statistics.mean(targets),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--rows", default="128,1024")
    parser.add_argument("--workers", default="8,16")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="the bundled corpus, tiny sizes")
    args = parser.parse_args(argv)
    draw = ORIGINAL_DRAW
    summary: dict[str, object] = {"benchmark": "softmax_rows"}
    with tempfile.TemporaryDirectory(prefix="bench-softmax-rows-") as scratch:
        if args.smoke:
            from benchmarks.bench_eval_protocols import prepare_benchmark_corpus

            args.rows, args.workers, args.steps = "4", "2", 2
            draw = CandidateSpec(ORIGINAL_DRAW.vocab_size, 64)
            dataset = prepare_benchmark_corpus("python-docs", Path(), Path(scratch), 10)
        elif not (args.data_root / "ptb").is_dir():
            print_summary({**summary, "skipped": f"no PTB under {args.data_root}"})
            return 0
        else:
            dataset = prepare_text(args.data_root, Path(scratch) / "dataset")
        vocab = load_manifest(dataset).vocab.size
        print(f"softmax rows a step, {vocab:,} word types, K = {draw.num_samples:,} a direction")
        print(
            f"{'rows':>6} {'workers':>8} {'one worker':>11} {'its bound':>10} "
            f"{'all workers':>12} {'shared draw':>12} {'targets':>8}"
        )
        for rows in (int(value) for value in args.rows.split(",")):
            for workers in (int(value) for value in args.workers.split(",")):
                ranks = worker_steps(dataset, rows, workers, args.steps, draw)
                figures = count(ranks, rows, draw)
                print(
                    f"{rows:6} {workers:8} {figures['worker']:11,.0f} {figures['bound']:10,} "
                    f"{figures['all']:12,.0f} {figures['all_shared_draw']:12,.0f} "
                    f"{figures['all_targets']:8,.0f}"
                )
                summary |= {f"{name}@{rows}x{workers}": v for name, v in figures.items()}
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
