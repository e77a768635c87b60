"""The pipeline on the team stack: ``pretrain/smoke`` deployed and run through the stack's process
worker, with MLflow and Prefect on the stack's PostgreSQL and Ray as a head plus a second node
(one CPU each, so that two training workers sit on different nodes).

One started stack serves the module, in order: one flow run end to end; three at once; a flow
run under which the MLflow server stops for 30 s; one under which the Prefect server restarts,
then its re-run; one that loses the second Ray node while it trains. Each flow run trains its own
biLM (its own ``train.seed``) on the one shared dataset.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import yaml
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from pipelines.tracking.flow_runs import TRAIN_LOSS_METRIC
from pipelines.train.checkpoint import CheckpointStore
from pipelines.train.run_directory import RUN_DIR_TAG, RunDirectory
from tests.integration.deployments import (
    BILM,
    ONE_CPU,
    ROOT,
    TERMINAL_STATES,
    bank_vectors,
    deploy_smoke,
    lock_errors,
    shorter_smoke,
    skip_without_postgres,
    stage_runs,
    start_smoke,
    three_at_once,
    two_one_cpu_nodes,
    user_shell,
    wait_for_flow_runs,
    watch_smoke,
)

pytestmark = [pytest.mark.integration, pytest.mark.team_stack]

T = TypeVar("T")


@pytest.fixture(scope="module")
def team(
    tmp_path_factory: pytest.TempPathFactory, local_stack, stack_module: ModuleType, free_port
) -> Iterator[dict[str, str]]:
    """The started team stack, the smoke deployment deployed on it; the user's environment."""
    skip_without_postgres(stack_module)
    home = tmp_path_factory.mktemp("team") / "elmo"
    settings = {
        "ELMO_STACK_DATABASE": "postgresql",
        "ELMO_POSTGRES_PORT": str(free_port()),
        **two_one_cpu_nodes(free_port),
    }
    with user_shell(local_stack, home, **settings) as env:
        deploy_smoke(env)
        yield env
    shutil.rmtree(stack_module.postgres_data_dir(home / "stack"), ignore_errors=True)


def _ray_get(env: dict[str, str], path: str) -> Any:
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{env['RAY_API_SERVER_ADDRESS']}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with opener.open(request, timeout=30) as response:
        return json.load(response)["data"]["result"]["result"]


def _training_nodes(env: dict[str, str]) -> set[str]:
    """The nodes that Ray Train's workers have run on, alive or gone (Ray's state API)."""
    actors = _ray_get(env, "/api/v0/actors?detail=1&limit=10000")
    return {actor["node_id"] for actor in actors if actor["class_name"] == "RayTrainWorker"}


ODD_TAGGING = """Zürich B-LOC
and O
東京 B-LOC
welcomed O
Søren B-PER
Müller I-PER
"""


def _non_ascii_task(root: Path) -> Path:
    """The bundled NER task under a non-ASCII path, its training file with non-ASCII words."""
    bundled = ROOT / "examples" / "tasks"
    folder = root / "aufgaben-ü"
    folder.mkdir()
    config = yaml.safe_load((bundled / "ner.yaml").read_text())
    for split in ("train", "dev", "test"):
        text = (bundled / config[split]).read_text(encoding="utf-8")
        extra = f"\n{ODD_TAGGING}" if split == "train" else ""
        (folder / f"ner-ä.{split}.conll").write_text(text.rstrip("\n") + "\n" + extra, "utf-8")
        config[split] = f"ner-ä.{split}.conll"
    task = folder / "ner-ä.yaml"
    task.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return task


@pytest.mark.timeout(900)
def test_a_flow_run_trains_across_both_nodes_and_registers_a_loadable_champion(
    team: dict[str, str], tmp_path: Path
) -> None:
    task = _non_ascii_task(tmp_path)
    began = time.monotonic()
    watch_smoke(team, shorter_smoke(ONE_CPU, tasks=(str(task),), num_workers=2))
    print(f"one flow run on the team stack: {time.monotonic() - began:.0f} s")

    nodes = _ray_get(team, "/api/v0/nodes?detail=1")
    assert len(nodes) == 2
    assert _training_nodes(team) == {node["node_id"] for node in nodes}
    client = MlflowClient(team["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias(BILM, "champion")
    assert champion.tags["elmo.perplexity"]
    first, second = bank_vectors(team)
    assert first[0] == pytest.approx(second[0], abs=1e-6)  # the context-free layer
    assert max(abs(a - b) for a, b in zip(first[2], second[2], strict=True)) > 1e-4


@pytest.mark.timeout(1200)
def test_three_flow_runs_at_once_each_keep_their_runs_and_versions(team: dict[str, str]) -> None:
    seconds = three_at_once(team, seeds=(11, 12, 13))
    print(f"three flow runs at once on the team stack: {seconds:.0f} s")
    assert lock_errors(team) == {"mlflow": 0, "prefect": 0}


def _service(stack_cli, env: dict[str, str], action: str, name: str) -> None:
    """Stop or start one service of the started stack, as its user would."""
    done = stack_cli(env, action, "--services", name)
    assert done.returncode == 0, done.stderr[-3000:]


def _wait_for(find: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found is not None:
            return found
        time.sleep(1)
    raise AssertionError(f"no {what} after {timeout:.0f} s")


def _train_run(client: MlflowClient, flow_run_id: str) -> Run | None:
    runs = [r for r in stage_runs(client, flow_run_id) if r.data.tags["elmo.stage"] == "train"]
    return runs[0] if runs else None


def _logged_loss(client: MlflowClient, flow_run_id: str) -> Run | None:
    """The flow run's train run once it has logged a training loss."""
    run = _train_run(client, flow_run_id)
    if run is None or not client.get_metric_history(run.info.run_id, TRAIN_LOSS_METRIC):
        return None
    return run


def _job_logs(env: dict[str, str], run: Run) -> str:
    """The Ray job's log (its driver's and its workers' output) that trained ``run``."""
    job = run.data.tags["ray.job_submission_id"]
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"{env['RAY_API_SERVER_ADDRESS']}/api/jobs/{job}/logs",
        headers={"Authorization": f"Bearer {token}"},
    )
    with opener.open(request, timeout=30) as response:
        return str(json.load(response)["logs"])


def _trains_long(seed: int) -> dict[str, Any]:
    """A flow run whose training outlasts what a test does to the stack under it: 200 steps,
    the loss logged and a checkpoint committed every 10."""
    steps = ("train.max_steps=200", "train.log_every=10", "train.checkpoint_every=10")
    return shorter_smoke(ONE_CPU, f"train.seed={seed}", *steps, num_workers=2)


@pytest.mark.timeout(900)
def test_training_rides_out_the_mlflow_server_stopped_for_30_s(
    team: dict[str, str], stack_cli
) -> None:
    client = MlflowClient(team["MLFLOW_TRACKING_URI"])
    flow_run = start_smoke(team, _trains_long(seed=21))
    run = _wait_for(lambda: _logged_loss(client, flow_run), 600, "logged training loss")
    stopped_at = time.time()
    _service(stack_cli, team, "stop", "mlflow")
    time.sleep(30)
    _service(stack_cli, team, "start", "mlflow")

    assert wait_for_flow_runs(team, [flow_run], 600) == {flow_run: "COMPLETED"}
    finished = client.get_run(run.info.run_id)
    assert finished.info.status == "FINISHED"
    assert finished.info.end_time / 1000 > stopped_at + 30, "training ended before the outage"
    loss = client.get_metric_history(run.info.run_id, TRAIN_LOSS_METRIC)
    assert [metric.step for metric in loss] == list(range(10, 201, 10))  # no gap, no duplicate
    retried = [line for line in _job_logs(team, run).splitlines() if "Retrying" in line]
    assert any("runs/log-batch" in line for line in retried), retried  # rank 0's, in the job log


@pytest.mark.timeout(900)
def test_a_flow_run_ends_true_across_a_prefect_restart_and_its_rerun_redoes_nothing(
    team: dict[str, str], stack_cli
) -> None:
    client = MlflowClient(team["MLFLOW_TRACKING_URI"])
    params = _trains_long(seed=31)
    flow_run = start_smoke(team, params)
    _wait_for(lambda: _logged_loss(client, flow_run), 600, "logged training loss")
    _service(stack_cli, team, "stop", "prefect")
    _service(stack_cli, team, "start", "prefect")

    ended = wait_for_flow_runs(team, [flow_run], 600)[flow_run]
    print(f"the flow run restarted under ended {ended}")
    assert ended in TERMINAL_STATES
    experiments = [e.experiment_id for e in client.search_experiments()]
    before = Counter(r.data.tags.get("elmo.stage") for r in client.search_runs(experiments))
    rerun = start_smoke(team, params)
    assert wait_for_flow_runs(team, [rerun], 600) == {rerun: "COMPLETED"}
    after = Counter(r.data.tags.get("elmo.stage") for r in client.search_runs(experiments))
    print(f"runs by stage before the re-run {dict(before)}, after {dict(after)}")
    assert after - before == Counter({"pretrain": 1})  # its own parent run, no stage redone


@pytest.mark.timeout(900)
def test_a_flow_run_survives_losing_the_second_ray_node(team: dict[str, str], stack_cli) -> None:
    client = MlflowClient(team["MLFLOW_TRACKING_URI"])
    flow_run = start_smoke(team, _trains_long(seed=41))
    run = _wait_for(lambda: _train_run(client, flow_run), 600, "train run")
    store = CheckpointStore(RunDirectory(run.data.tags[RUN_DIR_TAG]))
    committed = _wait_for(store.newest, 600, "committed checkpoint")
    _service(stack_cli, team, "stop", "ray-node")
    _service(stack_cli, team, "start", "ray-node")

    assert wait_for_flow_runs(team, [flow_run], 600) == {flow_run: "COMPLETED"}
    final = store.newest()
    assert final is not None and final.step == 200
    resumed = store.record(final)["resumed_from_step"]
    assert committed.step <= resumed < final.step
