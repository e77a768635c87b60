"""Language-model quality on Penn Treebank: train a named config, report heldout perplexity.

    python -m experiments.ptb_quality [--data-root ../shared/data] [--config configs/ptb-small.yaml]
        [--minutes 35 | --max-steps N] [--work DIR] [--set section.key=value ...]

Prepares PTB with the whitespace tokenizer, trains with the real train stage for ``--max-steps``
(or the steps that fit in ``--minutes``), and evaluates the final model with the evaluate stage's
default protocol on test and on valid. Last line: one JSON object; results and the context of Kim
et al. 2016's figure in experiments/ptb_quality-2026-11-21.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import ray
import torch

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import MANIFEST_NAME
from elmo_core.data.reader import load_manifest
from elmo_core.training.local_run import step_results
from elmo_core.training.step import TrainingStep
from pipelines.common.ray_cluster import connect_ray
from pipelines.common.settings import elmo_home
from pipelines.evaluate.stage import EvaluationResult, evaluate_bilm
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files
from pipelines.serving.bilm_loader import initial_bilm
from pipelines.train.job_config import TrainJobConfig, resolve_train_config
from pipelines.train.stage import TrainResult, train

REPO = Path(__file__).resolve().parents[1]
KIM_SMALL_TEST = 92.3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "ptb-small.yaml")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=35.0, help="training time budget")
    length.add_argument("--max-steps", type=int, help="a fixed run length instead")
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--work", type=Path, default=elmo_home() / "bench" / "ptb_quality")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    return parser.parse_args()


def prepare_ptb(ptb: Path, out: Path) -> str:
    """PTB as train + two heldout files, whitespace-tokenized; reused when already prepared."""
    if not (out / MANIFEST_NAME).is_file():
        corpus = CorpusFiles(
            str(ptb),
            "1b-benchmark",
            [ptb / "ptb.train.txt"],
            [ptb / "ptb.valid.txt", ptb / "ptb.test.txt"],
        )
        prepare_files(PrepareConfig(format="1b-benchmark"), corpus, str(out))
    return str(out)


def seconds_per_step(cfg: TrainJobConfig, data: str, steps: int) -> float:
    """Median seconds of one training step (both streams, backward, clip, Adagrad).

    The same work as a single Ray Train worker's step; :func:`run_length` runs it as a Ray task
    with the worker's CPUs, so it also gets the worker's threads (``OMP_NUM_THREADS``).
    """
    manifest = load_manifest(data)
    bilm = initial_bilm(cfg.model, manifest.vocab.size, None).train()
    step_once = TrainingStep.build(bilm, cfg.train, cfg.run.grad_exchange)
    results = step_results(step_once, data, torch.device("cpu"))  # batches built in the loop
    times = []
    for step in range(steps + 3):  # three warm-up steps
        started = time.perf_counter()
        next(results)
        if step >= 3:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def run_length(
    args: argparse.Namespace, cfg: TrainJobConfig, data: str
) -> tuple[int, float | None]:
    """(max_steps, measured seconds per step; None when ``--max-steps`` was given)."""
    if args.max_steps:
        return args.max_steps, None
    connect_ray()
    timer = ray.remote(num_cpus=cfg.run.cpus_per_worker)(seconds_per_step)  # [ray] worker's CPUs
    per_step = float(ray.get(timer.remote(cfg, data, args.timing_steps)))
    return max(1, int(args.minutes * 60 / per_step)), per_step


def report(
    cfg: TrainJobConfig,
    trained: TrainResult,
    scores: dict[str, EvaluationResult],
    per_step: float | None,
    train_positions: int,
) -> dict[str, object]:
    positions = trained.steps * cfg.train.batch_size * cfg.train.unroll_steps
    epochs = positions / train_positions  # a sentence of n tokens fills n + 1
    print(
        f"\n{trained.run_name}: {trained.steps} steps ({epochs:.2f} epochs), "
        f"{trained.seconds / 60:.1f} min, model → {trained.model_dir}"
    )
    print("\n| heldout | tokens | fwd ppl | bwd ppl | geo-mean ppl |")
    print("|---|---:|---:|---:|---:|")
    for name, score in scores.items():
        print(
            f"| {name} | {score.num_tokens} | {score.forward_perplexity:.2f} | "
            f"{score.backward_perplexity:.2f} | {score.perplexity:.2f} |"
        )
    print(f"\ncontext: Kim et al. 2016 small char-CNN, forward, ~25 epochs: {KIM_SMALL_TEST}")
    summary: dict[str, object] = {
        "benchmark": "ptb_quality",
        "model_dir": trained.model_dir,
        "steps": trained.steps,
        "epochs": round(epochs, 3),
        "train_seconds": round(trained.seconds, 1),
        "seconds_per_step_timed": None if per_step is None else round(per_step, 4),
    }
    for name, score in scores.items():
        summary[f"{name}_forward"] = round(score.forward_perplexity, 3)
        summary[f"{name}_backward"] = round(score.backward_perplexity, 3)
        summary[f"{name}_perplexity"] = round(score.perplexity, 3)
    return summary


def main() -> int:
    args = parse_args()
    ptb = args.data_root / "ptb"
    if not (ptb / "ptb.train.txt").is_file():
        print(f"skipped: no PTB under {args.data_root} (see ../shared/data/README.md)")
        print(json.dumps({"benchmark": "ptb_quality", "skipped": True}))
        return 0
    data = prepare_ptb(ptb, args.work / "dataset")
    cfg = resolve_train_config(None, args.config, args.overrides)
    # the timing and evaluate run here with the threads Ray gives the training worker: on a
    # shared 2-core machine two threads per process oversubscribe it (see configs/ptb-small.yaml)
    torch.set_num_threads(cfg.run.cpus_per_worker)
    max_steps, per_step = run_length(args, cfg, data)
    if per_step is not None:
        print(f"{per_step:.3f} s/step timed → train.max_steps={max_steps}", flush=True)
    cfg = resolve_train_config(None, args.config, [*args.overrides, f"train.max_steps={max_steps}"])
    trained = train(cfg, data)
    scores = {
        split: evaluate_bilm(trained.model_dir, data, files=[f"ptb.{split}"])
        for split in ("test", "valid")
    }
    split = load_manifest(data).split("train")
    summary = report(cfg, trained, scores, per_step, split.num_tokens + split.num_sentences)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
