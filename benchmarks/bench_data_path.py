"""The training data path alone: positions/s the batches reach a GPU step at, by loader processes.

    python -m benchmarks.bench_data_path [--data-root ../shared/data] [--steps 400]
    python -m benchmarks.bench_data_path --corpus python-docs     # no data needed (a GPU machine)

Reads PTB (or the bundled ``python-docs`` corpus) through
:class:`elmo_core.training.batches.StepBatches` exactly as a worker does, at the GPU recipe's
128 × 20: built in the training loop itself (the baseline, 0 loader processes) against built ahead
in 1 or 2 loader processes. The goal: loaders that build ≥ 2× a GPU's training rate from at most
4 cores per GPU. Last line: one JSON object; ``ratio`` = the training process's CPU per step in
the loop over that with 2 loader processes. Method and results:
benchmarks/results/bench_data_path-2026-11-25.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_eval_protocols import prepare_benchmark_corpus
from benchmarks.harness import print_summary
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.presets import model_preset
from elmo_core.training.batches import CandidateSpec, StepBatches, StreamSpec

REPO = Path(__file__).resolve().parents[1]

GOAL_TRAINING_RATE = 250_000  # positions/s on one H100: the GPU training goal
ORIGINAL_DRAW = CandidateSpec(vocab_size=793_471, num_samples=model_preset("original").num_samples)


def measure(dataset: str, rows: int, unroll: int, workers: int, steps: int) -> tuple[float, float]:
    """Positions/s the batches arrive at once the loader runs, and the training process's own CPU
    milliseconds per step: what the data path takes from the step's critical path."""
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    specs = tuple(  # candidate ids beyond the dataset's vocabulary: only the draw is timed
        StreamSpec(dataset, rows, unroll, 0, 1, reverse, seed, candidates=ORIGINAL_DRAW)
        for reverse, seed in ((False, 1), (True, 2))
    )
    pin = torch.cuda.is_available()
    with StepBatches(specs, manifest, table, workers=workers, pin_memory=pin) as batches:
        for _ in range(20):  # processes started, their first windows ready
            next(batches)
        started, cpu_started = time.perf_counter(), time.process_time()
        for _ in range(steps):
            next(batches)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        return rows * unroll * steps / seconds, 1e3 * cpu / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=["ptb", "python-docs"], default="ptb")
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ptb = args.data_root / "ptb"
    if args.corpus == "ptb" and not ptb.is_dir():
        print_summary({"benchmark": "data_path", "skipped": f"no PTB under {args.data_root}"})
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-data-path-") as scratch:
        dataset = prepare_benchmark_corpus(args.corpus, ptb, Path(scratch), 100)
        runs = {
            workers: [
                measure(dataset, args.rows, args.unroll, workers, args.steps)
                for _ in range(args.repeats)
            ]
            for workers in (0, 1, 2)
        }
    rates = {workers: statistics.median(r for r, _ in results) for workers, results in runs.items()}
    cpu = {workers: statistics.median(c for _, c in results) for workers, results in runs.items()}
    print(
        f"data path, {args.corpus}, {args.rows} rows × {args.unroll} steps, "
        f"median of {args.repeats}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'loader processes':18} {'positions/s':>12} {'vs in-loop':>11} {'vs 2×goal':>10} "
        f"{'trainer CPU ms/step':>20}"
    )
    for workers, rate in rates.items():
        print(
            f"{workers:<18} {rate:12,.0f} {rate / rates[0]:10.2f}x "
            f"{rate / (2 * GOAL_TRAINING_RATE):9.2f}x {cpu[workers]:20.2f}"
        )
    summary = {
        "benchmark": "data_path",
        "corpus": args.corpus,
        "rows": args.rows,
        "unroll": args.unroll,
        **{f"positions_per_s_{workers}": round(rate) for workers, rate in rates.items()},
        **{f"trainer_cpu_ms_per_step_{workers}": round(ms, 3) for workers, ms in cpu.items()},
        "ratio": round(cpu[0] / cpu[2], 3),
        "over_twice_goal": round(rates[2] / (2 * GOAL_TRAINING_RATE), 3),
    }
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
