"""The front door, end to end: local stack → `prefect deploy` → `prefect deployment run
pretrain/smoke --watch` → registered models that embed text in a fresh process.

Everything runs as a user would run it: the stack script (infra/local/stack.py) on free ports with
ELMO_HOME under tmp_path, each of its services checked with one real request, the Prefect CLI as
subprocesses with the stack's exports, the stack's process worker running the flow, training
submitted as a Ray Job to the stack's token-auth Ray head, MLflow served over HTTP. Afterwards the
stack is stopped, and no process of its sessions may remain (the ``local_stack`` fixture checks).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.deployments import (
    bank_vectors,
    deploy_smoke,
    run_cli,
    shorter_smoke,
    user_shell,
    watch_smoke,
)

# 477 s for the smoke deployment on the emulated slow machine (suite_slow-2026-11-30.md)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

# Ray reads RAY_AUTH_MODE when it is imported: the client runs in a process started with it.
FAILING_JOB_SCRIPT = """
import os
from ray.job_submission import JobSubmissionClient
from pipelines.train.ray_job import TrainJobFailed, wait_for_job
address = os.environ["RAY_API_SERVER_ADDRESS"]
job = JobSubmissionClient(address).submit_job(
    entrypoint="python -m pipelines.train --data /nonexistent/dataset --model tiny")
try:
    wait_for_job(address, job, poll_s=0.5)
except TrainJobFailed as failed:
    print(failed)
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, local_stack) -> Iterator[dict[str, str]]:
    """The started local stack; yields the environment a user's shell has after sourcing it."""
    home = tmp_path_factory.mktemp("e2e") / "elmo"
    with user_shell(local_stack, home, ELMO_RAY_NUM_CPUS="2", ELMO_STACK_TIMEOUT_S="240") as env:
        yield env


def test_the_stack_serves_each_service_and_a_second_start_finds_them_running(
    stack: dict[str, str], stack_cli: Callable[..., Any], stack_module: ModuleType, tmp_path: Path
) -> None:
    assert stack["RAY_AUTH_MODE"] == "token"
    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("stack-check")
    run = client.create_run(experiment)
    (tmp_path / "note.txt").write_text("served")
    client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
    stored = list((Path(stack["ELMO_HOME"]) / "mlartifacts").rglob("note.txt"))
    assert [path.read_text() for path in stored] == ["served"]  # the server's artifact store
    pool_url = f"{stack['PREFECT_API_URL']}/work_pools/elmo-process"
    with urllib.request.urlopen(pool_url, timeout=10) as response:
        pool = json.load(response)
    assert pool["type"] == "process" and pool["status"] == "READY"  # a worker polls it

    again = stack_cli(stack, "start")
    assert again.returncode == 0 and again.stderr.count("already running") == 4
    pids = sorted(path.stem for path in (Path(stack["ELMO_HOME"]) / "stack" / "pids").iterdir())
    assert pids == ["mlflow", "prefect", "ray", "worker"]
    # MLflow's server without its GenAI job runners: the server and its one web worker
    mlflow_session = int((Path(stack["ELMO_HOME"]) / "stack" / "pids" / "mlflow.pid").read_text())
    serving = stack_module.session_processes(mlflow_session)
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in serving]
    assert len(serving) == 2 and not [c for c in commands if b"huey" in c], commands


def test_smoke_deployment_runs_the_pipeline_and_registers_models_that_embed(
    stack: dict[str, str],
) -> None:
    began = time.monotonic()
    deploy_smoke(stack)
    watched = watch_smoke(stack, shorter_smoke())
    print(watched[-4000:], f"\nflow run finished after {time.monotonic() - began:.0f} s")

    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias("elmo-bilm", "champion")
    assert champion.tags["elmo.perplexity"]
    assert client.search_model_versions("name = 'elmo-ner'")
    first, second = bank_vectors(stack)
    # Layer 0 is the context-free token layer: the same word, the same vector.
    assert first[0] == pytest.approx(second[0], abs=1e-6)
    # The LSTM layers see the context: "bank" of money vs "bank" of a river.
    for layer in (1, 2):
        difference = max(abs(a - b) for a, b in zip(first[layer], second[layer], strict=True))
        assert difference > 1e-4, f"layer {layer}"


def test_a_failed_training_job_raises_with_its_log_tail(stack: dict[str, str]) -> None:
    failed = run_cli([sys.executable, "-c", FAILING_JOB_SCRIPT], stack, timeout=300)

    assert failed.returncode == 0, failed.stderr[-3000:]
    message = failed.stdout
    assert f"at {stack['RAY_API_SERVER_ADDRESS']} ended FAILED" in message
    assert "no manifest.json" in message  # the job's own error, from its log tail
