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
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from pipelines.registry.policy import current_champion, decide
from pipelines.registry.tags import TRAIN_RUN_TAG
from tests.integration.deployments import (
    bank_vectors,
    deploy_smoke,
    shorter_smoke,
    start_smoke,
    user_shell,
    wait_for_flow_runs,
    watch_smoke,
)

pytestmark = [pytest.mark.integration, pytest.mark.team_stack]

BILM = "elmo-bilm"
ONE_CPU = "run.cpus_per_worker=1"  # two workers: one on each node
# Every stage a flow run with one task over one seed leaves in MLflow (prepare only when its
# dataset was not cached yet).
STAGES = {"train", "evaluate", "register", "adapt"}


def _postgres_installed(stack_module: ModuleType) -> bool:
    try:
        stack_module.postgres_binary("initdb")
    except stack_module.StackError:
        return False
    return True


@pytest.fixture(scope="module")
def team(
    tmp_path_factory: pytest.TempPathFactory, local_stack, stack_module: ModuleType, free_port
) -> Iterator[dict[str, str]]:
    """The started team stack, the smoke deployment deployed on it; the user's environment."""
    if not _postgres_installed(stack_module):
        pytest.skip("no PostgreSQL here: apt-get install postgresql")
    home = tmp_path_factory.mktemp("team") / "elmo"
    settings = {
        "ELMO_STACK_DATABASE": "postgresql",
        "ELMO_POSTGRES_PORT": str(free_port()),
        "ELMO_RAY_NODE_AGENT_PORT": str(free_port()),
        "ELMO_RAY_NUM_CPUS": "1",
        "ELMO_STACK_TIMEOUT_S": "240",
    }
    with user_shell(local_stack, home, **settings) as env:
        deploy_smoke(env)
        yield env
    shutil.rmtree(stack_module.postgres_data_dir(home / "stack"), ignore_errors=True)


def _stage_runs(client: MlflowClient, flow_run_id: str) -> list[Run]:
    experiments = [e.experiment_id for e in client.search_experiments()]
    tag = f"tags.`prefect.flow_run_id` = '{flow_run_id}'"
    return client.search_runs(experiments, filter_string=tag, max_results=1000)


def _check_stage_runs(client: MlflowClient, flow_run_id: str) -> dict[str, Run]:
    """Every stage of the flow run left one FINISHED run; training its loss at every logged
    step, the others artifacts. The stage runs by stage name."""
    runs = _stage_runs(client, flow_run_id)
    by_stage = Counter(run.data.tags["elmo.stage"] for run in runs)
    assert set(by_stage) >= STAGES, by_stage
    assert set(by_stage.values()) == {1}, by_stage
    assert {run.info.status for run in runs} == {"FINISHED"}
    stages = {run.data.tags["elmo.stage"]: run for run in runs}
    loss = client.get_metric_history(stages["train"].info.run_id, "bilm/train/loss")
    assert [metric.step for metric in loss] == sorted({metric.step for metric in loss})
    for stage in ("train", "adapt"):
        assert client.list_artifacts(stages[stage].info.run_id), stage
    return stages


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


@pytest.mark.timeout(900)
def test_a_flow_run_trains_across_both_nodes_and_registers_a_loadable_champion(
    team: dict[str, str],
) -> None:
    began = time.monotonic()
    watch_smoke(team, shorter_smoke(ONE_CPU, num_workers=2))
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
    client = MlflowClient(team["MLFLOW_TRACKING_URI"])
    before = {int(v.version) for v in client.search_model_versions(f"name = '{BILM}'")}
    params = [
        shorter_smoke(ONE_CPU, f"train.seed={seed}", tasks=(task,), num_workers=2)
        for seed, task in ((11, "ner"), (12, "questions"), (13, "docstrings"))
    ]
    began = time.monotonic()
    ids = [start_smoke(team, one) for one in params]
    states = wait_for_flow_runs(team, ids, timeout=1000)
    print(f"three flow runs at once on the team stack: {time.monotonic() - began:.0f} s")

    assert set(states.values()) == {"COMPLETED"}, states
    registered = []
    for flow_run_id in ids:
        stages = _check_stage_runs(client, flow_run_id)
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
