"""Deployment files that cannot run here (no container engine, no cluster), checked for consistency.

Compose: services, dependencies, variables, volumes and health checks agree with each other and
with the .env example. KubeRay: the fields the ray.io/v1 CRDs require, written out by hand from
the CRD reference. Dockerfile: what it copies exists and it installs with the pinned constraints.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from elmo_core.presets import PRESETS

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_DIR = ROOT / "infra" / "compose"
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
# ${NAME}, ${NAME:-default}, ${NAME?error}; `$${NAME}` is a literal `${NAME}` for the container.
COMPOSE_VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:[:?-][^}]*)?\}")
PIPELINE_ENV = {"MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"}


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE_DIR / "docker-compose.yaml")


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _env_example() -> dict[str, str]:
    lines = (COMPOSE_DIR / ".env.example").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return dict(pairs)


def test_every_compose_variable_is_defined_in_the_env_example_and_none_is_stale() -> None:
    used = set(COMPOSE_VARIABLE.findall((COMPOSE_DIR / "docker-compose.yaml").read_text()))
    assert used == set(_env_example())


def test_compose_dependencies_name_services_that_can_satisfy_their_condition(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for target, rule in service.get("depends_on", {}).items():
            assert target in services, f"{name} depends on missing {target}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits on unhealthy {target}"
            if rule["condition"] == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} must run once"


def test_every_long_running_compose_service_has_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    missing = [
        n for n, s in services.items() if s.get("restart") != "no" and "healthcheck" not in s
    ]
    assert missing == []


def test_compose_volumes_are_declared_and_bind_mounts_exist(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    for service in services.values():
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).is_file(), source
            else:
                assert source in compose["volumes"], source


def test_compose_builds_use_the_project_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    builds = [s["build"] for s in services.values() if "build" in s]
    assert len(builds) >= 2
    for build in builds:
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == ROOT
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_wires_pipeline_processes_to_tracking_storage_and_servers(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in ("mlflow", "ray-head", "ray-gpu-worker", "prefect-worker"):
        assert set(services[name]["environment"]) >= PIPELINE_ENV, name
    worker_env = services["prefect-worker"]["environment"]
    assert worker_env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert worker_env["RAY_ADDRESS"].split(":")[0] in services
    for name in ("ray-head", "ray-gpu-worker", "prefect-worker"):
        assert services[name]["environment"]["RAY_AUTH_MODE"] == "token"
    assert "--pool" in services["prefect-worker"]["command"]
    assert "elmo-process" in services["prefect-worker"]["command"]


def test_compose_gpu_workers_reserve_nvidia_devices(services: dict[str, dict[str, Any]]) -> None:
    devices = services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]
    assert "--address=ray-head:6379" in services["ray-gpu-worker"]["command"]


def test_compose_backends_are_postgres_and_s3(services: dict[str, dict[str, Any]]) -> None:
    prefect_db = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    mlflow_args = " ".join(services["mlflow"]["command"])
    assert prefect_db.startswith("postgresql+asyncpg://")
    assert "--backend-store-uri=postgresql+psycopg2://" in mlflow_args
    assert "--artifacts-destination=s3://" in mlflow_args
    init_script = " ".join(services["minio-init"]["command"])
    assert "mc mb" in init_script


# ---- KubeRay ------------------------------------------------------------------------------------


def _check_pod_template(template: dict[str, Any], where: str) -> list[dict[str, Any]]:
    containers = template["spec"]["containers"]
    assert containers, where
    for container in containers:
        assert container["name"] and container["image"], where
        assert {"requests", "limits"} <= set(container["resources"]), where
    return containers


def _check_ray_start_params(params: dict[str, Any], where: str) -> None:
    # The CRD types rayStartParams as map[string]string: a bare YAML number or bool is rejected.
    assert all(isinstance(v, str) for v in params.values()), where


@pytest.fixture(scope="module")
def raycluster() -> dict[str, Any]:
    return _yaml(ROOT / "infra" / "k8s" / "raycluster.yaml")


def test_raycluster_has_the_fields_the_crd_requires(raycluster: dict[str, Any]) -> None:
    assert (raycluster["apiVersion"], raycluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert raycluster["metadata"]["name"]
    spec = raycluster["spec"]
    assert spec["rayVersion"] == ray.__version__
    head = spec["headGroupSpec"]
    _check_ray_start_params(head["rayStartParams"], "head")
    _check_pod_template(head["template"], "head")
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        where = group["groupName"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
        _check_ray_start_params(group["rayStartParams"], where)
        _check_pod_template(group["template"], where)


def test_raycluster_has_a_cpu_head_and_a_gpu_worker_group(raycluster: dict[str, Any]) -> None:
    head = raycluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"]["limits"]
    gpu_limits = [
        c["resources"]["limits"].get("nvidia.com/gpu")
        for g in raycluster["spec"]["workerGroupSpecs"]
        for c in g["template"]["spec"]["containers"]
    ]
    assert any(gpu_limits)


def test_rayjob_runs_the_train_stage_on_the_elmo_cluster(raycluster: dict[str, Any]) -> None:
    job = _yaml(ROOT / "infra" / "k8s" / "rayjob-pretrain.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == raycluster["metadata"]["name"]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "pipelines.train"]
    pairs = list(zip(argv[3::2], argv[4::2], strict=True))
    options = dict(pairs)
    assert options["--data"].startswith("s3://")
    assert options["--model"] in PRESETS
    overrides = dict(value.split("=", 1) for flag, value in pairs if flag == "--set")
    gpu_replicas = sum(g["replicas"] for g in raycluster["spec"]["workerGroupSpecs"])
    assert overrides["run.use_gpu"] == "true"
    assert 1 <= int(overrides["run.num_workers"]) <= gpu_replicas
    _check_pod_template(job["spec"]["submitterPodTemplate"], "submitter")


# ---- Dockerfile ---------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_dockerfile_copies_existing_sources_and_every_package() -> None:
    copied = []
    for keyword, args in _instructions():
        if keyword == "COPY":
            *sources, _ = [a for a in args.split() if not a.startswith("--")]
            copied += sources
    assert all((ROOT / source).exists() for source in copied), copied
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {name.rstrip("*") for name in packages["packages"]["find"]["include"]}
    assert wanted | {"pyproject.toml", "constraints.txt", "README.md"} <= set(copied)


def test_dockerfile_installs_with_the_constraints_on_a_switchable_base() -> None:
    instructions = _instructions()
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in instructions
    assert ("FROM", "${BASE_IMAGE}") in instructions
    installs = [
        args for keyword, args in instructions if keyword == "RUN" and "pip install" in args
    ]
    assert len(installs) == 1
    assert "-c constraints.txt" in installs[0]


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    kept = {
        line[1:].rstrip("/")
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = {
        source
        for keyword, args in _instructions()
        if keyword == "COPY"
        for source in args.split()[:-1]
    }
    assert copied <= kept
