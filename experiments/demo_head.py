"""The demo's in-domain task (``examples/tasks/docstrings.yaml``) under a biLM: ELMo against the
baseline over seeds 0, 1, 2, for the shipped head and for variants of it.

    python -m experiments.demo_head --bilm RUN_DIR/model \
        --variants '[{}, {"head": {"hidden_dim": 64, "elmo_layer_norm": true}}]'

Each variant updates the task's ``head`` and ``training`` keys. One line per variant: each
model's test accuracy as mean ± sample standard deviation, and the gain with its verdict, as the
adapt stage words them (``elmo_core.tasks.seeds``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from elmo_core.tasks import load_task_config
from elmo_core.tasks.seeds import Scores, difference
from elmo_core.tasks.trainer import train_task
from pipelines.common.task_data import cache_splits, read_splits
from pipelines.serving.bilm_loader import load_bilm, resolve_bilm

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "docstrings.yaml"
SEEDS = (0, 1, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", required=True, help="a biLM model directory or URI")
    parser.add_argument("--variants", default="[{}]", help="JSON list of task-key updates")
    args = parser.parse_args(argv)
    bilm = load_bilm(resolve_bilm(args.bilm)).bilm
    base = load_task_config(TASK)
    with tempfile.TemporaryDirectory(prefix="demo-head-") as cache:
        splits = cache_splits(bilm, read_splits(base), cache)
        for variant in json.loads(args.variants):
            head = base.head.model_copy(update=variant.get("head", {}))
            training = base.training.model_copy(update=variant.get("training", {}))
            task = base.model_copy(update={"head": head, "training": training})
            scores = {
                use_elmo: [
                    train_task(
                        task, splits["train"], splits["dev"], splits["test"], use_elmo, seed=seed
                    ).test_metrics["accuracy"]
                    for seed in SEEDS
                ]
                for use_elmo in (True, False)
            }
            elmo, baseline = Scores(tuple(scores[True])), Scores(tuple(scores[False]))
            print(
                f"{json.dumps(variant)}: ELMo {elmo}, baseline {baseline}, "
                f"{difference(elmo, baseline)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
