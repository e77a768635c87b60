"""The whole pipeline on this machine, in one command: ``python -m flows.run_local`` (``make run``).

Runs the ``pretrain`` flow with the embedded defaults — Prefect's ephemeral mode, a Ray started
in-process, MLflow on ``$ELMO_HOME/mlflow.db`` — on the bundled ``python-docs`` corpus and the
bundled NER task, with the same parameters as the ``pretrain/smoke`` deployment. It ends by
printing how to open the MLflow UI and a sample embedding from ``models:/elmo-bilm@champion``.
Any of ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``, ``RAY_ADDRESS`` set in the environment switch
that part to a real server (for example after ``eval "$(infra/local/status.sh)"``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SMOKE_TASK = "examples/tasks/ner.yaml"
SMOKE_TRAINING = [
    "train.max_steps=200",
    "train.batch_size=16",
    "train.log_every=20",
    "train.checkpoint_every=100",
    "train.validate_every=100",
    "train.validation_sentences=100",
]


def smoke_parameters(repo: Path = REPO) -> dict[str, Any]:
    """The ``pretrain/smoke`` deployment's parameters (prefect.yaml holds the same, tested)."""
    return {
        "data": {"corpus": "python-docs"},
        "training": {"model": "tiny", "overrides": SMOKE_TRAINING},
        "tasks": [str(repo / SMOKE_TASK)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, help="training steps (default: the smoke 200)")
    args = parser.parse_args(argv)
    from pipelines.common.settings import elmo_home

    # Prefect's own state (the ephemeral server's database) under ELMO_HOME too, unless set.
    os.environ.setdefault("PREFECT_HOME", str(elmo_home() / "prefect"))
    # Its first start creates that database; 20 s (Prefect's default) is short on a busy laptop.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.params import PretrainParams
    from flows.pretrain import pretrain
    from pipelines.common import demo

    parameters = smoke_parameters()
    if args.max_steps is not None:
        parameters["training"]["overrides"] += [f"train.max_steps={args.max_steps}"]
    summary = pretrain(PretrainParams.model_validate(parameters))
    print(f"\nregistered {summary.model_uri} (heldout perplexity {summary.perplexity:.1f})")
    print(f"task models: {', '.join(summary.task_models) or 'none'}")
    print(demo.mlflow_ui_hint())
    print(demo.sample_embedding())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
