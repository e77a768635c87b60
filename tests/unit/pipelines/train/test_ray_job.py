"""Ray Job submission: the config travels as a file the job reads, the job's command line, an
unreachable jobs API."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest

from pipelines.train.job_config import resolve_train_config
from pipelines.train.preflight import plan_training
from pipelines.train.ray_job import (
    JOB_CONFIG_FILE,
    RayJobsUnreachable,
    connect_jobs,
    job_entrypoint,
    read_job_config,
    write_job_config,
)

SENTENCES = [f"w{i % 97} w{(3 * i) % 89} w{i % 5} end" for i in range(120)]  # > 64 types


@pytest.fixture
def dataset(make_dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    return make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]})


def test_the_job_reads_the_resolved_config_pinned_to_the_planned_run(dataset: str) -> None:
    cfg = resolve_train_config("tiny", None, ["train.max_steps=5", "run.num_workers=2"])
    plan = plan_training(cfg, dataset)

    written = write_job_config(cfg, plan)
    read = read_job_config(written)

    assert written == f"{plan.run_dir.url}/{JOB_CONFIG_FILE}"
    assert read.model_dump(exclude={"run"}) == cfg.model_dump(exclude={"run"})
    assert read.run.num_workers == 2
    assert read.run.name == plan.name  # the job trains the run planned here...
    assert f"{read.run.storage_path}/{read.run.name}" == plan.run_dir.url  # ...where it lives
    again = plan_training(read, dataset)
    assert (again.name, again.run_dir.url) == (plan.name, plan.run_dir.url)


def test_the_entrypoint_is_the_train_command_on_the_job_config(dataset: str) -> None:
    plan = plan_training(resolve_train_config("tiny"), dataset)

    argv = shlex.split(
        job_entrypoint("/runs/x/job_config.json", plan, "parent123", {"prefect.flow_run_id": "f 1"})
    )

    assert argv[:3] == ["python", "-m", "pipelines.train"]
    assert argv[argv.index("--job-config") + 1] == "/runs/x/job_config.json"
    assert argv[argv.index("--data") + 1] == plan.data
    assert "--set" not in argv and "--model" not in argv
    assert argv[-5:] == [
        "--tag",
        "prefect.flow_run_id=f 1",
        "--parent-run-id",
        "parent123",
        "--no-register",
    ]


def test_an_unreachable_jobs_api_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}"

    with pytest.raises(RayJobsUnreachable, match=f"Ray jobs API at {address}"):
        connect_jobs(address)
