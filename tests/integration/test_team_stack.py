"""The team stack (``ELMO_STACK_DATABASE=postgresql``): the MLflow and Prefect servers on a real
PostgreSQL cluster that infra/local/stack.py makes and starts, checked over HTTP and in the
database itself; a server started without its database fails at once, naming it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.deployments import skip_without_postgres

pytestmark = [pytest.mark.integration, pytest.mark.team_stack]  # make test-team-stack

FLOW_SCRIPT = """
import json
from prefect import flow

@flow(name="team-stack-check")
def check(word: str) -> str:
    return word.upper()

state = check("bänk", return_state=True)
print(json.dumps({"state": state.type.value, "result": state.result()}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def team_stack(tmp_path: Path, local_stack, stack_module: ModuleType) -> Iterator[Any]:
    skip_without_postgres(stack_module)
    home = tmp_path / "elmo"
    settings = {"ELMO_STACK_DATABASE": "postgresql", "ELMO_POSTGRES_PORT": str(_free_port())}
    with local_stack(home, ELMO_STACK_TIMEOUT_S="200", **settings) as stack:
        yield stack
    shutil.rmtree(stack_module.postgres_data_dir(home / "stack"), ignore_errors=True)


def _rows(stack: Any, module: ModuleType, database: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg2

    state = Path(stack.env["ELMO_HOME"]) / "stack"
    connection = psycopg2.connect(
        host="127.0.0.1", port=int(stack.env["ELMO_POSTGRES_PORT"]), dbname=database,
        user=module.POSTGRES_USER, password=module.postgres_password(state),
    )  # fmt: skip
    try:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return cursor.fetchall()
    finally:
        connection.close()


@pytest.mark.timeout(400)
def test_mlflow_and_prefect_store_in_postgresql_and_keep_long_and_non_ascii_values(
    team_stack, stack_module: ModuleType, tmp_path: Path
) -> None:
    began = time.monotonic()
    started = team_stack.run("start", "--services", "postgres,mlflow,prefect")
    assert started.returncode == 0, started.stderr
    print(started.stderr, f"start took {time.monotonic() - began:.1f} s")
    exports = team_stack.exports(started.stdout)

    client = MlflowClient(tracking_uri=exports["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("team-stack-check")
    run = client.create_run(experiment, run_name="prüfung ✓ 模型")
    run_id = run.info.run_id
    client.log_metric(run_id, "loss", 2.5, step=3)
    client.set_tag(run_id, "long", "t" * 8000)  # MLflow's limits, whole
    client.log_param(run_id, "long", "p" * 6000)
    note = tmp_path / "note.txt"
    note.write_text("served through the proxy")
    client.log_artifact(run_id, str(note))
    stored = client.get_run(run_id)
    assert stored.info.run_name == "prüfung ✓ 模型"
    assert (len(stored.data.tags["long"]), len(stored.data.params["long"])) == (8000, 6000)
    assert stored.info.artifact_uri.startswith("mlflow-artifacts:")
    assert (Path(client.download_artifacts(run_id, "note.txt", str(tmp_path / "back")))).read_text()
    in_postgres = _rows(team_stack, stack_module, "mlflow", "SELECT name FROM runs")
    assert in_postgres == [("prüfung ✓ 模型",)]
    assert not (Path(team_stack.env["ELMO_HOME"]) / "mlflow.db").exists()  # no SQLite beside it

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env |= {"PREFECT_API_URL": exports["PREFECT_API_URL"], "PREFECT_HOME": str(tmp_path / "p")}
    flow = subprocess.run(
        [sys.executable, "-c", FLOW_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert flow.returncode == 0, flow.stderr[-3000:]
    assert json.loads(flow.stdout.splitlines()[-1]) == {"state": "COMPLETED", "result": "BÄNK"}
    flows = "SELECT f.name FROM flow_run r JOIN flow f ON f.id = r.flow_id"
    names = _rows(team_stack, stack_module, "prefect", flows)
    assert ("team-stack-check",) in names


@pytest.mark.timeout(200)
def test_a_server_started_without_its_database_fails_at_once_naming_it(team_stack) -> None:
    began = time.monotonic()
    result = team_stack.run("start", "--services", "mlflow", timeout=60)
    assert result.returncode == 1
    assert "mlflow needs postgres, which is not running" in result.stderr
    assert time.monotonic() - began < 20
    assert not (Path(team_stack.env["ELMO_HOME"]) / "stack" / "pids" / "mlflow.pid").exists()


@pytest.mark.timeout(200)
def test_a_password_the_cluster_refuses_fails_at_once_naming_the_server(team_stack) -> None:
    started = team_stack.run("start", "--services", "postgres")
    assert started.returncode == 0, started.stderr
    state = Path(team_stack.env["ELMO_HOME"]) / "stack"
    (state / "postgres_password").write_text("not-the-clusters")
    began = time.monotonic()
    again = team_stack.run("start", "--services", "postgres,mlflow", timeout=60)
    assert again.returncode == 1
    port = team_stack.env["ELMO_POSTGRES_PORT"]
    assert f"PostgreSQL on 127.0.0.1:{port} refused the stack" in again.stderr
    assert "password authentication failed" in again.stderr
    assert time.monotonic() - began < 20
    assert not (state / "pids" / "mlflow.pid").exists()  # nothing started on it
