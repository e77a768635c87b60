"""Do bucketed training batches change what a task model scores? Each seed trains the task with
ELMo and without, once with ``training.batches: random`` and once ``bucketed``, on one biLM.

    python -m experiments.task_batches --bilm RUN_DIR/best --task examples/tasks/docstrings.yaml \
        [--seeds 8] [--threads 1]

Bucketing is a speed change (benchmarks/results/task_lstm-2026-11-29.md): similar lengths share a
batch, so a CPU's LSTM computes little padding. It also changes which examples share a batch, so
the scores move; this says by how much against the seeds' spread. Last line: one JSON object, per
batching the test scores' mean and standard deviation with and without ELMo; results in
benchmarks/results/make_run-slow-2026-11-29.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import print_summary
from elmo_core.tasks import load_task_config
from elmo_core.tasks.seeds import Scores
from elmo_core.tasks.trainer import main_metric, train_task
from pipelines.common.task_data import cache_splits, read_splits
from pipelines.serving.bilm_loader import load_bilm, resolve_bilm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", required=True, help="a biLM model directory or URI")
    parser.add_argument("--task", type=Path, required=True, help="a task config (YAML)")
    parser.add_argument("--seeds", type=int, default=8, help="seeds 0 to N - 1")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = load_task_config(args.task)
    metric = main_metric(task)
    summary: dict[str, object] = {"experiment": "task_batches", "task": task.name}
    with tempfile.TemporaryDirectory(prefix="task-batches-") as work:
        bilm = load_bilm(resolve_bilm(args.bilm), Path(work) / "bilm").bilm
        splits = cache_splits(bilm, read_splits(task), Path(work) / "activations")
        for batches in ("random", "bucketed"):
            training = task.training.model_copy(update={"batches": batches})
            config = task.model_copy(update={"training": training})
            for use_elmo, name in ((True, "elmo"), (False, "baseline")):
                scores = Scores(
                    tuple(
                        train_task(
                            config, splits["train"], splits["dev"], splits.get("test"),
                            use_elmo, seed=seed,
                        ).test_metrics[metric]
                        for seed in range(args.seeds)
                    )
                )  # fmt: skip
                print(f"{batches:>8} {name:>8}: test {metric} {scores}", flush=True)
                summary[f"{batches}/{name}"] = [round(scores.mean, 4), round(scores.sd, 4)]
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
