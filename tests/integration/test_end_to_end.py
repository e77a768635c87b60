"""The front door, end to end: local stack → `prefect deploy` → `prefect deployment run
pretrain/smoke --watch` → registered models that embed text in a fresh process.

Everything runs as a user would run it: the stack script on free ports with ELMO_HOME under
tmp_path, the Prefect CLI as subprocesses with the stack's exports, the stack's process worker
running the flow, training submitted as a Ray Job to the stack's token-auth Ray head, MLflow
served over HTTP. Afterwards the stack is stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# A fresh interpreter that knows only the tracking URI, as a user's notebook would.
EMBED_SCRIPT = """
import json, mlflow, pandas as pd
model = mlflow.pyfunc.load_model("models:/elmo-bilm@champion")
out = model.predict(pd.DataFrame({"sentence": [
    "She went to the bank to withdraw money.", "They sat on the bank of the river."]}))
banks = []
for tokens, layers in zip(out["tokens"], out["embeddings"]):
    index = list(tokens).index("bank")
    banks.append([[float(x) for x in layer[index]] for layer in layers])
print(json.dumps(banks))
"""

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


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, local_stack) -> Iterator[dict[str, str]]:
    """The started local stack; yields the environment a user's shell has after sourcing it."""
    tmp_path = tmp_path_factory.mktemp("e2e")
    with local_stack(
        tmp_path / "elmo",
        ELMO_RAY_NUM_CPUS="2",
        ELMO_STACK_TIMEOUT_S="240",
        ELMO_REPO=str(ROOT),
        MLFLOW_DISABLE_TELEMETRY="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    ) as local:
        started = local.run("start", timeout=600)
        assert started.returncode == 0, started.stderr
        exported = local.exports(started.stdout)
        yield {**local.env, **exported, "PREFECT_HOME": str(tmp_path / "cli")}


def _bank_vectors(env: dict[str, str]) -> list[list[list[float]]]:
    embedded = _run([sys.executable, "-c", EMBED_SCRIPT], env, timeout=300)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    return json.loads(embedded.stdout.strip().splitlines()[-1])


def _shorter_smoke() -> dict[str, Any]:
    """The deployment's parameters for a shorter run: 30 steps of the tiny preset, the NER task
    over one seed, no analysis (the demo's whole set is checked in
    tests/unit/flows/test_deployments.py)."""
    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (smoke,) = [
        d for d in config["deployments"] if d["name"] == "smoke" and "pretrain" in d["entrypoint"]
    ]
    params = smoke["parameters"]["params"]
    short = ["train.max_steps=30", "train.checkpoint_every=30", "train.validate_every=30"]
    params["training"] = {**params["training"], "model": "tiny"}
    params["training"]["overrides"] = [*params["training"]["overrides"], *short]
    return params | {"tasks": ["examples/tasks/ner.yaml"], "seeds": [0], "analyze": False}


def test_smoke_deployment_runs_the_pipeline_and_registers_models_that_embed(
    stack: dict[str, str],
) -> None:
    began = time.monotonic()
    prefect = str(Path(sys.executable).parent / "prefect")

    deployed = _run([prefect, "--no-prompt", "deploy", "--name", "pretrain/smoke"], stack, 300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    run = [prefect, "deployment", "run", "pretrain/smoke", "--watch", "--watch-timeout", "600"]
    watched = _run([*run, "--param", f"params={json.dumps(_shorter_smoke())}"], stack, 660)
    print(watched.stdout[-4000:], f"\nflow run finished after {time.monotonic() - began:.0f} s")

    assert watched.returncode == 0, watched.stdout[-4000:] + watched.stderr[-2000:]
    assert "Flow run finished successfully in 'Completed'" in watched.stdout
    client = MlflowClient(stack["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias("elmo-bilm", "champion")
    assert champion.tags["elmo.perplexity"]
    assert client.search_model_versions("name = 'elmo-ner'")
    first, second = _bank_vectors(stack)
    # Layer 0 is the context-free token layer: the same word, the same vector.
    assert first[0] == pytest.approx(second[0], abs=1e-6)
    # The LSTM layers see the context: "bank" of money vs "bank" of a river.
    for layer in (1, 2):
        difference = max(abs(a - b) for a, b in zip(first[layer], second[layer], strict=True))
        assert difference > 1e-4, f"layer {layer}"


def test_a_failed_training_job_raises_with_its_log_tail(stack: dict[str, str]) -> None:
    failed = _run([sys.executable, "-c", FAILING_JOB_SCRIPT], stack, timeout=300)

    assert failed.returncode == 0, failed.stderr[-3000:]
    message = failed.stdout
    assert f"at {stack['RAY_API_SERVER_ADDRESS']} ended FAILED" in message
    assert "no manifest.json" in message  # the job's own error, from its log tail
