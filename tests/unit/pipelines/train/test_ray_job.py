"""Ray Job submission: the user's command line, where the run lives, an unreachable jobs API."""

from __future__ import annotations

import json
import shlex
import socket
from pathlib import Path

import pytest

from pipelines.train.ray_job import (
    RayJobsUnreachable,
    TrainJob,
    already_finished,
    connect_jobs,
    finished_run,
)
from pipelines.train.run_directory import RunDirectory


@pytest.fixture
def dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    root = tmp_path / "ds"
    root.mkdir()
    (root / "manifest.json").write_text('{"any": "manifest"}')
    return str(root)


def _job(dataset: str, *overrides: str) -> TrainJob:
    return TrainJob(model="tiny", overrides=list(overrides), dataset=dataset)


def test_the_entrypoint_is_the_train_command_with_the_run_directorys_storage(dataset: str) -> None:
    job = _job(dataset, "train.max_steps=5", "run.num_workers=2", "run.use_gpu=false")

    argv = shlex.split(job.entrypoint("parent123", {"prefect.flow_run_id": "f 1"}))

    assert argv[:5] == ["python", "-m", "pipelines.train", "--data", dataset]
    assert argv[argv.index("--model") + 1] == "tiny"
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    storage = str(Path(dataset).parent / "home" / "runs")
    assert sets == [
        "train.max_steps=5",
        "run.num_workers=2",
        "run.use_gpu=false",
        f"run.storage_path={storage}",
    ]
    assert argv[-5:] == [
        "--tag",
        "prefect.flow_run_id=f 1",
        "--parent-run-id",
        "parent123",
        "--no-register",
    ]


def test_the_run_directory_is_named_by_config_and_data_not_by_scaling(dataset: str) -> None:
    one = _job(dataset, "run.num_workers=1").run_directory()
    four = _job(dataset, "run.num_workers=4").run_directory()
    longer = _job(dataset, "train.max_steps=9", "run.num_workers=1").run_directory()

    assert one.url == four.url
    assert one.url != longer.url
    assert Path(one.url).name.startswith("bilm-")


def _write_finished(run_dir: RunDirectory) -> None:
    record = {
        "run_name": Path(run_dir.url).name,
        "run_dir": run_dir.url,
        "model_dir": f"{run_dir.url}/model",
        "best_model_dir": None,
        "mlflow_run_id": "r1",
        "steps": 5,
        "total_steps": 5,
        "resumed_from_step": 0,
        "best_perplexity": 12.5,
        "stopped_early": False,
        "seconds": 1.0,
    }
    Path(run_dir.url).mkdir(parents=True)
    (Path(run_dir.url) / "FINISHED.json").write_text(json.dumps(record))


def test_a_finished_run_is_read_back_from_its_record(tmp_path: Path) -> None:
    run_dir = RunDirectory(str(tmp_path / "bilm-x"))
    assert finished_run(run_dir) is None
    _write_finished(run_dir)

    result = finished_run(run_dir)

    assert result is not None and (result.steps, result.mlflow_run_id) == (5, "r1")
    assert not result.already_finished


def test_a_job_whose_run_finished_before_needs_no_submission(dataset: str) -> None:
    job = _job(dataset, "train.max_steps=5")
    assert already_finished(job) is None
    _write_finished(job.run_directory())

    result = already_finished(job)

    assert result is not None and result.already_finished
    assert result.run_dir == job.run_directory().url


def test_an_unreachable_jobs_api_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}"

    with pytest.raises(RayJobsUnreachable, match=f"Ray jobs API at {address}"):
        connect_jobs(address)
