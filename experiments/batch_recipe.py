"""A larger batch per GPU: what the recipe needs with it, from 300 steps against bilm-tf's 128 rows.

    python -m experiments.batch_recipe [--preset original] [--rows 1024] [--steps 300]
        [--corpus ptb (under --data-root) | python-docs (bundled: for a machine without data)]

Three runs from the same initial weights, with the step a Ray worker runs (bf16 on CUDA) fed by
its data path: bilm-tf's recipe (128 rows, Adagrad lr 0.2); ``--rows`` rows at lr 0.2; and
``--rows`` rows at lr 0.2·√(rows/128) (the square-root rule for adaptive optimisers). For each:
the sampled loss (mean of the last 10 steps) after ``--steps`` steps, the same at the positions
the 128-row run reached in its steps (rows/128 times fewer steps), seconds per step, and the
heldout perplexity (full softmax, a fixed sample, both directions) at the end. Steps per epoch
follow from the manifest at any batch (tokens / (rows × unroll × workers)), so the learning rate
is the recipe's one free choice. On CUDA the model runs the LSTM kernel a GPU run defaults to
(``pipelines.train.job_config.GPU_DEFAULTS``). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.bench_eval_protocols import prepare_benchmark_corpus
from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest
from elmo_core.model.bilm import BiLM
from elmo_core.perplexity import evaluate_perplexity
from elmo_core.presets import model_preset
from elmo_core.training.local_run import step_results
from elmo_core.training.step import TrainingStep
from pipelines.prepare.corpus_sources import SAMPLE_CORPUS
from pipelines.train.job_config import GPU_DEFAULTS

REPO = Path(__file__).resolve().parents[1]

BASE_ROWS, BASE_LR, UNROLL, MEAN_OF = 128, 0.2, 20, 10
HELDOUT_WINDOWS = 20  # 128 × 20 positions each


class Run(NamedTuple):
    losses: list[float]  # one per step
    s_per_step: float
    heldout_perplexity: float  # after the last step


def train(dataset: str, preset: str, rows: int, lr: float, steps: int, device: torch.device) -> Run:
    """One run from the shared initial weights."""
    torch.manual_seed(0)  # the same initial weights in every run
    config = model_preset(preset)
    if device.type == "cuda":  # the kernel a GPU run defaults to
        config = config.model_copy(update=GPU_DEFAULTS["model"])
    bilm = BiLM(config, load_manifest(dataset).vocab.size).to(device).train()
    recipe = TrainConfig(batch_size=rows, unroll_steps=UNROLL, lr=lr, bf16=device.type == "cuda")
    step = TrainingStep.build(bilm, recipe)
    workers = 2 if device.type == "cuda" else 0
    results = step_results(step, dataset, device, workers=workers)
    started = time.perf_counter()
    losses = torch.stack(
        [result.output.loss.detach().float() for result in itertools.islice(results, steps)]
    ).tolist()
    seconds = time.perf_counter() - started
    results.close()
    bilm.eval()
    heldout = evaluate_perplexity(
        bilm,
        dataset,
        "heldout",
        batch_size=BASE_ROWS,
        unroll_steps=UNROLL,
        max_windows=HELDOUT_WINDOWS,
        device=device,
        progress=False,
    )
    return Run(losses, seconds / steps, heldout.perplexity)


def mean_before(losses: list[float], steps: int) -> float:
    """Mean loss of the ``MEAN_OF`` steps up to step ``steps`` (at least the first)."""
    window = losses[max(0, steps - MEAN_OF) : max(1, steps)]
    return sum(window) / len(window)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--corpus", choices=["ptb", SAMPLE_CORPUS], default="ptb")
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    args = parser.parse_args(argv)
    if args.rows <= BASE_ROWS:
        parser.error(f"--rows is the larger batch: more than {BASE_ROWS}, got {args.rows}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ptb = args.data_root / "ptb"
    if args.corpus == "ptb" and not ptb.is_dir():
        print(
            json.dumps({"benchmark": "batch_recipe", "skipped": f"no PTB under {args.data_root}"})
        )
        return 0
    scaled_lr = BASE_LR * math.sqrt(args.rows / BASE_ROWS)
    settings = [(BASE_ROWS, BASE_LR), (args.rows, BASE_LR), (args.rows, scaled_lr)]
    with tempfile.TemporaryDirectory(prefix="batch-recipe-") as scratch:
        dataset = prepare_benchmark_corpus(args.corpus, ptb, Path(scratch), 0)
        runs = [train(dataset, args.preset, rows, lr, args.steps, device) for rows, lr in settings]
    base_positions = BASE_ROWS * UNROLL * args.steps
    print(
        f"{args.preset} on {args.corpus}, {device}, {args.steps} steps; the 128-row run reaches "
        f"{base_positions:,} positions"
    )
    print(
        f"{'rows':>5} {'lr':>6} {'loss@steps':>11} {'loss@128-row positions':>23} "
        f"{'heldout ppl':>12} {'s/step':>8}"
    )
    summary: dict[str, object] = {
        "benchmark": "batch_recipe",
        "preset": args.preset,
        "corpus": args.corpus,
        "device": device.type,
        "steps": args.steps,
    }
    for (rows, lr), run in zip(settings, runs, strict=True):
        at_positions = mean_before(run.losses, round(base_positions / (rows * UNROLL)))
        at_steps = mean_before(run.losses, args.steps)
        print(
            f"{rows:5} {lr:6.3f} {at_steps:11.3f} {at_positions:23.3f} "
            f"{run.heldout_perplexity:12.1f} {run.s_per_step:8.3f}"
        )
        curve = range(MEAN_OF, args.steps + 1, MEAN_OF)
        summary[f"rows{rows}_lr{lr:.3f}"] = {
            "loss_at_steps": round(at_steps, 4),
            "loss_at_base_positions": round(at_positions, 4),
            "heldout_perplexity": round(run.heldout_perplexity, 2),
            "s_per_step": round(run.s_per_step, 4),
            "curve": [round(mean_before(run.losses, end), 4) for end in curve],
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
