"""The demo's in-domain task (``examples/tasks/docstrings.yaml``) under a biLM: ELMo against the
baseline over seeds 0, 1, 2, for the shipped head and for variants of it.

    python experiments/demo_head.py --bilm RUN_DIR/model \
        --variants '[{}, {"head": {"hidden_dim": 64, "elmo_layer_norm": true}}]'

Each variant updates the task's ``head`` and ``training`` keys. One line per variant: each
model's test accuracy as mean ± sample standard deviation, the gain and the spread of the
difference (√(s²_ELMo + s²_baseline)), and whether the gain is beyond it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from elmo_core.tasks import load_task_config
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
            elmo, baseline = scores[True], scores[False]
            gain = statistics.mean(elmo) - statistics.mean(baseline)
            spread = math.hypot(statistics.stdev(elmo), statistics.stdev(baseline))
            print(
                f"{json.dumps(variant)}: ELMo {statistics.mean(elmo):.4f} ± "
                f"{statistics.stdev(elmo):.4f}, baseline {statistics.mean(baseline):.4f} ± "
                f"{statistics.stdev(baseline):.4f}, gain {gain:+.4f}, spread {spread:.4f}: "
                + ("beyond" if gain > spread else "within"),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
