"""The ``pretrain/smoke`` deployment driven as a user drives it, for the tests that run it on a
started local stack (test_end_to_end.py and test_sqlite_stack_runs.py on SQLite,
test_team_pipeline.py on PostgreSQL): the Prefect CLI as subprocesses with the stack's exports,
flow runs watched over the Prefect API, what each left in MLflow, the champion loaded in a fresh
interpreter."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from pipelines.registry.policy import current_champion, decide
from pipelines.registry.tags import TRAIN_RUN_TAG
from pipelines.tracking.flow_runs import TRAIN_LOSS_METRIC

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
TERMINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
BILM = "elmo-bilm"  # the flow's registered biLM
ONE_CPU = "run.cpus_per_worker=1"  # two workers: one on each node
# Every stage a flow run with one task over one seed leaves in MLflow (prepare only when its
# dataset was not cached yet).
STAGES = {"train", "evaluate", "register", "adapt"}

# A fresh interpreter that knows only the tracking URI, as a user's notebook would: the vectors
# of "bank" in two sentences, every layer.
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


@contextmanager
def user_shell(
    local_stack: Callable[..., AbstractContextManager[Any]], home: Path, **settings: str
) -> Iterator[dict[str, str]]:
    """The local stack started under ``home`` with ``settings``; yields the environment a user's
    shell has after sourcing it (the Prefect CLI's own state beside ``home``)."""
    with local_stack(
        home,
        ELMO_REPO=str(ROOT),
        MLFLOW_DISABLE_TELEMETRY="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        **settings,
    ) as local:
        started = local.run("start", timeout=600)
        assert started.returncode == 0, started.stderr
        exported = local.exports(started.stdout)
        yield {**local.env, **exported, "PREFECT_HOME": str(home.parent / "cli")}


def skip_without_postgres(stack_module: ModuleType) -> None:
    """Skip, saying how to install it, where Debian's PostgreSQL is not here."""
    try:
        stack_module.postgres_binary("initdb")
    except stack_module.StackError:
        pytest.skip("no PostgreSQL here: apt-get install postgresql")


def two_one_cpu_nodes(free_port: Callable[[], int]) -> dict[str, str]:
    """The stack settings of the team's Ray: a head and a second node, one CPU each, so that two
    training workers sit on different nodes."""
    return {
        "ELMO_RAY_WORKER_NODE": "1",
        "ELMO_RAY_NODE_AGENT_PORT": str(free_port()),
        "ELMO_RAY_NUM_CPUS": "1",
        "ELMO_STACK_TIMEOUT_S": "240",
    }


def run_cli(
    args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def deploy_smoke(env: dict[str, str]) -> None:
    """``prefect deploy --name pretrain/smoke`` from this checkout."""
    deployed = run_cli([PREFECT, "--no-prompt", "deploy", "--name", "pretrain/smoke"], env, 300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr


def shorter_smoke(
    *overrides: str, tasks: tuple[str, ...] = ("ner",), num_workers: int = 1
) -> dict[str, Any]:
    """The deployment's parameters for a shorter run: 30 steps of the tiny preset (then
    ``overrides``) on ``num_workers``, ``tasks`` (bundled ones by name, others as YAML paths)
    over one seed, no analysis (the demo's whole set is checked in
    tests/unit/flows/test_deployments.py)."""
    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (smoke,) = [
        d for d in config["deployments"] if d["name"] == "smoke" and "pretrain" in d["entrypoint"]
    ]
    params = smoke["parameters"]["params"]
    short = ["train.max_steps=30", "train.checkpoint_every=30", "train.validate_every=30"]
    training = params["training"] | {"model": "tiny", "num_workers": num_workers}
    training["overrides"] = [*training["overrides"], *short, *overrides]
    task_files = [
        task if task.endswith(".yaml") else f"examples/tasks/{task}.yaml" for task in tasks
    ]
    return params | {"training": training, "tasks": task_files, "seeds": [0], "analyze": False}


def watch_smoke(env: dict[str, str], params: dict[str, Any], timeout: float = 1300) -> str:
    """``prefect deployment run pretrain/smoke --watch`` with ``params``; its stdout, once the
    flow run completed."""
    run = [PREFECT, "deployment", "run", "pretrain/smoke", "--watch"]
    run += ["--watch-timeout", str(int(timeout)), "--param", f"params={json.dumps(params)}"]
    watched = run_cli(run, env, timeout + 60)
    assert watched.returncode == 0, watched.stdout[-4000:] + watched.stderr[-2000:]
    assert "Flow run finished successfully in 'Completed'" in watched.stdout
    return watched.stdout


def start_smoke(env: dict[str, str], params: dict[str, Any]) -> str:
    """``prefect deployment run pretrain/smoke`` with ``params``, not waited for: its flow run."""
    run = [PREFECT, "deployment", "run", "pretrain/smoke"]
    started = run_cli([*run, "--param", f"params={json.dumps(params)}"], env, 120)
    assert started.returncode == 0, started.stdout + started.stderr
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", started.stdout)
    assert found, started.stdout
    return found.group(1)


def flow_run_state(env: dict[str, str], flow_run_id: str) -> str:
    """The flow run's state type (``RUNNING``, ``COMPLETED``, ...) from the Prefect API."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"{env['PREFECT_API_URL']}/flow_runs/{flow_run_id}"
    with opener.open(url, timeout=30) as response:
        return str(json.load(response)["state_type"])


def wait_for_flow_runs(env: dict[str, str], ids: list[str], timeout: float) -> dict[str, str]:
    """Each flow run's terminal state type, polled until all have one (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    states = {run_id: "" for run_id in ids}
    while time.monotonic() < deadline:
        states = {run_id: flow_run_state(env, run_id) for run_id in ids}
        if all(state in TERMINAL_STATES for state in states.values()):
            break
        time.sleep(2)
    return states


def bank_vectors(env: dict[str, str]) -> list[list[list[float]]]:
    """The champion's vectors of "bank" in two sentences, loaded in a fresh interpreter."""
    embedded = run_cli([sys.executable, "-c", EMBED_SCRIPT], env, timeout=300)
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    return json.loads(embedded.stdout.strip().splitlines()[-1])


def stage_runs(client: MlflowClient, flow_run_id: str) -> list[Run]:
    experiments = [e.experiment_id for e in client.search_experiments()]
    tag = f"tags.`prefect.flow_run_id` = '{flow_run_id}'"
    return client.search_runs(experiments, filter_string=tag, max_results=1000)


def check_stage_runs(client: MlflowClient, flow_run_id: str) -> dict[str, Run]:
    """Every stage of the flow run left one FINISHED run; training its loss at every logged
    step, the others artifacts. The stage runs by stage name."""
    runs = stage_runs(client, flow_run_id)
    by_stage = Counter(run.data.tags["elmo.stage"] for run in runs)
    assert set(by_stage) >= STAGES, by_stage
    assert set(by_stage.values()) == {1}, by_stage
    assert {run.info.status for run in runs} == {"FINISHED"}
    stages = {run.data.tags["elmo.stage"]: run for run in runs}
    loss = client.get_metric_history(stages["train"].info.run_id, TRAIN_LOSS_METRIC)
    assert loss, "no training loss logged"
    assert [metric.step for metric in loss] == sorted({metric.step for metric in loss})
    for stage in ("train", "adapt"):
        assert client.list_artifacts(stages[stage].info.run_id), stage
    return stages


LOCK_ERRORS = ("database is locked", "deadlock detected", "could not serialize access")
SERVERS = ("mlflow", "prefect")


def lock_errors(env: dict[str, str]) -> dict[str, int]:
    """How often each server's log says its database refused a write for another writer."""
    logs = Path(env["ELMO_HOME"]) / "stack" / "logs"
    texts = {server: (logs / f"{server}.log").read_text(errors="replace") for server in SERVERS}
    return {server: sum(map(text.count, LOCK_ERRORS)) for server, text in texts.items()}


def three_at_once(env: dict[str, str], seeds: tuple[int, int, int]) -> float:
    """Start three flow runs together (each its own biLM and task, one dataset), check each
    kept all its runs and exactly one registered version, and that the champion alias is where
    the policy puts it; the seconds until all three ended."""
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    before = {int(v.version) for v in client.search_model_versions(f"name = '{BILM}'")}
    tasks = ("ner", "questions", "docstrings")
    params = [
        shorter_smoke(ONE_CPU, f"train.seed={seed}", tasks=(task,), num_workers=2)
        for seed, task in zip(seeds, tasks, strict=True)
    ]
    began = time.monotonic()
    ids = [start_smoke(env, one) for one in params]
    states = wait_for_flow_runs(env, ids, timeout=1000)
    seconds = time.monotonic() - began

    assert set(states.values()) == {"COMPLETED"}, states
    registered = []
    for flow_run_id in ids:
        stages = check_stage_runs(client, flow_run_id)
        train_run = stages["train"].info.run_id
        found = f"name = '{BILM}' and tags.`{TRAIN_RUN_TAG}` = '{train_run}'"
        (version,) = client.search_model_versions(found)  # one, not two or none
        registered.append(int(version.version))
    versions = client.search_model_versions(f"name = '{BILM}'")
    assert sorted(int(v.version) for v in versions) == sorted(before | set(registered))
    assert len(set(registered)) == 3
    champion = current_champion(BILM, client)
    assert champion is not None
    for version in versions:  # no version the policy would crown over the champion
        assert decide(version, champion).alias != "champion" or version.version == champion.version
    return seconds
