"""CPU training step: positions/s of the real biLM training step, fused LSTM against reference.

    python -m benchmarks.bench_cpu_step              # small and ptb-small, 32 and 128 rows × 20
    python -m benchmarks.bench_cpu_step --presets ptb-small --rows 32 --threads 1 --steps 9
    python -m benchmarks.bench_cpu_step --smoke      # tiny sizes (tested in CI)

The CPU training step: :class:`elmo_core.training.step.TrainingStep` on synthetic Zipf
windows, called as a worker calls it, for ``reference``, ``fused`` and ``fused-batched``, the
variants timed in turn. Last line: one JSON object; ``ratio`` = the geometric mean of fused over
reference positions/s. Method and results: benchmarks/results/bench_cpu_step-2026-11-25.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from benchmarks.harness import print_summary, time_in_turn
from benchmarks.workload import synthetic_windows, worker_step
from elmo_core.config import ModelConfig, TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.presets import PRESETS, model_preset
from elmo_core.training.step import TrainingStep

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {  # name: (lstm_impl, batch_directions)
    "reference": ("reference", False),
    "fused": ("fused", False),
    "fused-batched": ("fused", True),
}


def model_config(name: str) -> ModelConfig:
    """A preset (``small``…) or a config under ``configs/`` (``ptb-small``): its model."""
    if name in PRESETS:
        return model_preset(name)
    with open(REPO / "configs" / f"{name}.yaml") as file:
        return ModelConfig.model_validate(yaml.safe_load(file)["model"])


def build_step(
    config: ModelConfig, variant: str, rows: int, window: int, vocab: int, types: int
) -> Callable[[], None]:
    impl, batch_directions = VARIANTS[variant]
    config = config.model_copy(update={"lstm_impl": impl, "batch_directions": batch_directions})
    torch.manual_seed(0)
    model = BiLM(config, vocab).train()
    cpu = torch.device("cpu")
    windows, token_types, targets = synthetic_windows(
        rows, window, vocab, types, config.char_cnn.max_chars_per_token, cpu
    )
    recipe = TrainConfig(batch_size=rows, unroll_steps=window, bf16=False)
    return worker_step(TrainingStep.build(model, recipe, "sparse"), windows, token_types, targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="small,ptb-small")
    parser.add_argument("--rows", default="32,128")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--threads", default="1,2", help="torch threads, comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=", ".join(VARIANTS))
    parser.add_argument("--vocab", type=int, default=100_000, help="softmax words")
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.presets, args.rows, args.window, args.threads = "tiny", "4", 5, "1"
        args.vocab, args.types, args.steps, args.warmup = 200, 50, 2, 1
    variants = [name for name in args.variants.split(",") if name]
    if "reference" not in variants:
        parser.error("--variants must include reference (the baseline)")
    threads_before = torch.get_num_threads()
    load_before = os.getloadavg()
    started = time.perf_counter()
    rates: dict[tuple[str, int, int], dict[str, float]] = {}
    for preset in args.presets.split(","):
        config = model_config(preset)
        for rows in (int(value) for value in args.rows.split(",")):
            runs = {
                variant: build_step(config, variant, rows, args.window, args.vocab, args.types)
                for variant in variants
            }
            for threads in (int(value) for value in args.threads.split(",")):
                torch.set_num_threads(threads)
                seconds = time_in_turn(runs, args.steps, args.warmup)
                rates[preset, rows, threads] = {
                    name: rows * args.window / value for name, value in seconds.items()
                }
    torch.set_num_threads(threads_before)
    load_after = os.getloadavg()
    print(
        f"CPU training step (float32), vocab {args.vocab:,}, window {args.window}, "
        f"median of {args.steps} steps after {args.warmup} warm-up, variants in turn; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}; load average before "
        f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
        f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    header = f"{'preset':10} {'rows':>5} {'threads':>7} " + " ".join(
        f"{name + ' pos/s':>19}" for name in variants
    )
    others = [name for name in variants if name != "reference"]
    print(header + "".join(f" {name + '/ref':>18}" for name in others))
    summary: dict[str, object] = {
        "benchmark": "cpu_step",
        "vocab": args.vocab,
        "window": args.window,
        "steps": args.steps,
        "loadavg_1min_before": round(load_before[0], 2),
        "loadavg_1min_after": round(load_after[0], 2),
    }
    ratios = []
    for (preset, rows, threads), rate in rates.items():
        setting = f"{preset}_{rows}x{args.window}_t{threads}"
        line = f"{preset:10} {rows:5} {threads:7} " + " ".join(
            f"{rate[name]:19,.0f}" for name in variants
        )
        print(line + "".join(f" {rate[name] / rate['reference']:17.3f}x" for name in others))
        for name in variants:
            summary[f"{setting}_{name}_positions_per_s"] = round(rate[name], 1)
        if "fused" in rate:
            ratios.append(rate["fused"] / rate["reference"])
            summary[f"ratio_{setting}"] = round(ratios[-1], 3)
        if "fused-batched" in rate:
            summary[f"ratio_batched_{setting}"] = round(
                rate["fused-batched"] / rate["reference"], 3
            )
    if ratios:
        summary["ratio"] = round(math.exp(statistics.fmean(map(math.log, ratios))), 3)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
