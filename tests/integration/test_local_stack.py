"""The real local stack (infra/local/stack.py): MLflow server, Prefect server + worker, Ray head.

Started on free ports with ELMO_HOME under tmp_path, checked with one real request each, then
stopped; afterwards no process of the stack's sessions may remain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.integration

# Runs in a fresh interpreter with only the printed exports, as a user's shell would.
RAY_JOB_SCRIPT = """
import json, time
from ray.job_submission import JobStatus, JobSubmissionClient
client = JobSubmissionClient()  # RAY_API_SERVER_ADDRESS
job = client.submit_job(entrypoint="python -c 'import sys; print(42, sys.prefix)'")
deadline = time.monotonic() + 120
while not client.get_job_status(job).is_terminal() and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps({"status": str(client.get_job_status(job)), "logs": client.get_job_logs(job)}))
"""


def _session_processes(session: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, NotADirectoryError):
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session:
            found.append(f"{entry.name}:{stat[stat.find('(') + 1 : stat.rfind(')')]}")
    return found


@pytest.fixture
def stack(tmp_path: Path, local_stack) -> Iterator[Any]:
    with local_stack(
        tmp_path / "elmo", ELMO_RAY_NUM_CPUS="1", ELMO_STACK_TIMEOUT_S="200"
    ) as not_started:
        yield not_started


def _check_mlflow(env: dict[str, str], uri: str, tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("stack-check")
    run = client.create_run(experiment)
    note = tmp_path / "note.txt"
    note.write_text("served")
    client.log_artifact(run.info.run_id, str(note))
    home = Path(env["ELMO_HOME"])
    assert client.get_experiment(experiment).name == "stack-check"
    assert (home / "mlflow.db").is_file()
    stored = list((home / "mlartifacts").rglob("note.txt"))
    assert [path.read_text() for path in stored] == ["served"]


def _check_prefect(api_url: str) -> None:
    with urllib.request.urlopen(f"{api_url}/work_pools/elmo-process", timeout=10) as response:
        pool = json.load(response)
    assert pool["type"] == "process"
    assert pool["status"] == "READY"  # a worker polls it


def _check_ray(exports: dict[str, str]) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, **exports}
    result = subprocess.run(
        [sys.executable, "-c", RAY_JOB_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    job = json.loads(result.stdout.splitlines()[-1])
    assert job["status"] == "SUCCEEDED", job["logs"]
    # The head put this venv first on PATH, so the entrypoint's `python` is ours.
    assert f"42 {sys.prefix}" in job["logs"]


@pytest.mark.timeout(400)  # 125 s on a slow 2-core machine (issue 47)
def test_stack_starts_serves_and_stops_without_leftovers(stack, tmp_path: Path) -> None:
    began = time.monotonic()
    started = stack.run("start")
    assert started.returncode == 0, started.stderr
    print(started.stderr, f"start took {time.monotonic() - began:.1f} s")
    exports = stack.exports(started.stdout)
    assert exports["RAY_AUTH_MODE"] == "token"

    _check_mlflow(stack.env, exports["MLFLOW_TRACKING_URI"], tmp_path)
    _check_prefect(exports["PREFECT_API_URL"])
    _check_ray(exports)

    again = stack.run("start")
    assert again.returncode == 0
    assert again.stderr.count("already running") == 4

    pids = Path(stack.env["ELMO_HOME"]) / "stack" / "pids"
    sessions = {path.stem: int(path.read_text()) for path in pids.glob("*.pid")}
    assert sorted(sessions) == ["mlflow", "prefect", "ray", "worker"]
    assert all(_session_processes(session) for session in sessions.values())
    stopped = stack.run("stop", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert {name: _session_processes(s) for name, s in sessions.items()} == {
        name: [] for name in sessions
    }
    assert stack.run("status").returncode == 1


def test_failed_start_shows_the_service_log_and_leaves_nothing(stack) -> None:
    stack.env["ELMO_RAY_NUM_CPUS"] = "-1"  # `ray start` launches the GCS, then fails

    result = stack.run("start", "--services", "ray")

    assert result.returncode == 1
    assert "ray exited with code 1; log tail:" in result.stderr
    assert "Resource quantities must be nonnegative" in result.stderr
    # The pid file goes only once every process of the session is gone.
    assert not (Path(stack.env["ELMO_HOME"]) / "stack" / "pids" / "ray.pid").exists()
