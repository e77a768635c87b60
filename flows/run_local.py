"""The whole pipeline on this machine, in one command: ``python -m flows.run_local`` (``make run``).

The ``pretrain/smoke`` parameters with the embedded defaults (Prefect's ephemeral mode, Ray
in-process, MLflow on ``$ELMO_HOME/mlflow.db``); ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI`` or
``RAY_ADDRESS`` switch that part to a real server.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import UUID

from flows.prefect_database import seed_database
from pipelines.common.console import quiet_environment
from pipelines.common.settings import RAY_JOBS_ENV, elmo_home

REPO = Path(__file__).resolve().parents[1]
# The bundled tasks: docstrings is in the corpus's own domain, with 60 labels per class.
SMOKE_TASKS = [
    "examples/tasks/docstrings.yaml",
    "examples/tasks/ner.yaml",
    "examples/tasks/questions.yaml",
]
# mini for 1,000 steps of 32 rows, one worker with both cores: a biLM that helps the in-domain
# task beyond the gain's standard deviation in about two minutes
# (benchmarks/results/demo_setup-2026-11-28.md); tiny for 200 or 1,000 steps did not.
SMOKE_TRAINING = [
    "train.max_steps=1000",
    "train.batch_size=32",
    "run.cpus_per_worker=2",
    "train.log_every=100",
    "train.checkpoint_every=500",
    "train.validate_every=500",
    "train.validation_sentences=100",
]
# The smallest fraction that leaves every label of the bundled tasks an example, and the whole.
SMOKE_FRACTIONS = [0.1, 1.0]
# Settings under which Prefect's ephemeral server does not store in PREFECT_HOME's database
OWN_PREFECT_DATABASE = (
    "PREFECT_API_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    "PREFECT_API_DATABASE_CONNECTION_URL",
)


def smoke_parameters(repo: Path = REPO) -> dict[str, Any]:
    """The ``pretrain/smoke`` deployment's parameters (prefect.yaml holds the same, tested)."""
    return {
        "data": {"corpus": "python-docs"},
        "training": {"model": "mini", "overrides": SMOKE_TRAINING},
        "tasks": [str(repo / task) for task in SMOKE_TASKS],
        "seeds": [0, 1, 2],
        "analyze": True,
        "fractions": SMOKE_FRACTIONS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, help="training steps (default: the smoke 1000)")
    parser.add_argument(
        "--seeds", help="comma-separated seeds of the task runs (default: 0,1,2); fewer is faster"
    )
    parser.add_argument(
        "--fractions",
        help="comma-separated training fractions of the analysis (default: 0.1,1; "
        "0.1,0.25,0.5,1 draws the whole curve)",
    )
    parser.add_argument(
        "--tasks",
        help="comma-separated task files to adapt and analyze (default: the three bundled, "
        "examples/tasks/{docstrings,ner,questions}.yaml)",
    )
    args = parser.parse_args(argv)
    quiet_environment()  # before mlflow and ray are imported
    for name, value in embedded_settings(elmo_home(), os.environ).items():
        os.environ.setdefault(name, value)
    if not any(os.environ.get(name) for name in OWN_PREFECT_DATABASE):
        seed_database(Path(os.environ["PREFECT_HOME"]))  # the ephemeral server's first start
    from flows.params import PretrainParams
    from flows.pretrain import pretrain
    from pipelines import demo
    from pipelines.tracking.flow_runs import mlflow_ui_hint

    parameters = smoke_parameters()
    if args.max_steps is not None:
        parameters["training"]["overrides"] += [f"train.max_steps={args.max_steps}"]
    if args.seeds is not None:
        parameters["seeds"] = [int(seed) for seed in args.seeds.split(",")]
    if args.fractions is not None:
        parameters["fractions"] = [float(part) for part in args.fractions.split(",")]
    if args.tasks is not None:
        parameters["tasks"] = [str(Path(task).resolve()) for task in args.tasks.split(",")]
    state = pretrain(PretrainParams.model_validate(parameters), return_state=True)
    summary = state.result()
    champion = " (@champion)" if summary.champion else ""
    print(f"\nbiLM {summary.model_uri}{champion}: heldout perplexity {summary.perplexity:.1f}")
    print("\n".join(summary.task_scores))
    print(mlflow_ui_hint())
    print(prefect_ui_hint(state.state_details.flow_run_id))
    print(demo.sense_demo())
    print("\nThe analysis (elmo analyze), in short:")
    print("\n".join(f"  {line}" for line in summary.analysis_headline))
    return 0


def prefect_ui_hint(flow_run_id: UUID | None) -> str:
    """The link that opens this flow run in Prefect's UI; in ephemeral mode, first the command
    that serves the history it left in PREFECT_HOME where the link points: 127.0.0.1:4200,
    Prefect's default, or ``PREFECT_UI_URL``'s address (the UI then needs ``PREFECT_UI_API_URL``
    to find its API on that port)."""
    from prefect.settings import get_current_settings

    from flows.runs import LOCAL_PREFECT_UI, flow_run_url
    from pipelines.tracking.flow_runs import listen_flags

    settings, link = get_current_settings(), flow_run_url(flow_run_id)
    if settings.api.url:
        return f"Prefect UI: {link}"
    environment = f"PREFECT_HOME={shlex.quote(str(settings.home))}"
    ui = settings.ui_url or LOCAL_PREFECT_UI
    where = listen_flags(ui, LOCAL_PREFECT_UI)
    if where:
        environment += f" PREFECT_UI_API_URL={ui.rstrip('/')}/api"
    return f"Prefect UI: {environment} prefect server start{where}\n  then open {link}"


def embedded_settings(home: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The embedded run's settings, read when Prefect and Ray are imported; what the environment
    already sets wins. Prefect keeps its state under ELMO_HOME and prints the flow's and tasks'
    lines, not its temporary server's (its "prefect" logger; the run loggers below it keep INFO).
    """
    settings = {
        "PREFECT_HOME": str(home / "prefect"),
        # Its first start creates the database; 20 s (Prefect's default) is short on a busy laptop.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LOGGERS_PREFECT_LEVEL": "WARNING",
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    }
    if not environ.get("RAY_ADDRESS") and not environ.get(RAY_JOBS_ENV):
        # Only a local Ray, with Ray's default for a new one (token authentication) asked for
        # explicitly: Ray then starts it without a warning about that default.
        settings["RAY_AUTH_MODE"] = "token"
    return settings


if __name__ == "__main__":
    raise SystemExit(main())
