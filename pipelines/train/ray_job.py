"""Training as a Ray Job: the same ``python -m pipelines.train`` a user submits by hand.

A flow submits the command line a user would type after ``ray job submit --``, with the flow's
MLflow parent run in the job's environment (``ELMO_MLFLOW_PARENT_RUN_ID``) and its tracking URI, so
the training run nests under the flow's run wherever the job lands. Token auth is Ray's own: the
client adds the bearer token when ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` are set (what
``infra/local/stack.py`` exports).

The run directory is where the outcome is found: the job writes ``FINISHED.json`` there (the run's
name is a function of config and data), so the caller reads the :class:`TrainResult` back from it —
and skips the job entirely when an earlier submission already finished the run.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict
from ray.job_submission import JobStatus, JobSubmissionClient

from elmo_core.data.manifest import manifest_sha256
from pipelines.common.settings import mlflow_tracking_uri
from pipelines.common.tracking import PARENT_RUN_ENV
from pipelines.train.config import (
    TrainJobConfig,
    resolve_train_config,
    run_name,
    storage_root,
)
from pipelines.train.run_directory import FINISHED_FILE, RunDirectory
from pipelines.train.stage import TrainResult

LOG_TAIL_LINES = 60
POLL_S = 2.0
SUBMISSION_TAG = "ray.job_submission_id"  # on the flow's parent run and the job's train run


class RayJobsUnreachable(ConnectionError):
    """The Ray jobs API did not answer (a transient failure: the submission is retried)."""


class TrainJobFailed(RuntimeError):
    """The training job ended in FAILED or STOPPED; the message holds its log tail."""


class TrainJob(BaseModel):
    """What ``python -m pipelines.train`` is given: a preset, ``--set`` overrides, a dataset."""

    model_config = ConfigDict(frozen=True)

    model: str
    overrides: list[str]
    dataset: str

    def job_config(self) -> TrainJobConfig:
        """The resolved config, as ``pipelines.train`` resolves its command line."""
        return resolve_train_config(self.model, None, self.overrides)

    def run_directory(self) -> RunDirectory:
        """Where the run lives, named as the train stage names it."""
        cfg = self.job_config()
        name = run_name(cfg, manifest_sha256(self.dataset))
        return RunDirectory(f"{storage_root(cfg.run)}/{name}")

    def entrypoint(self, parent_run_id: str, tags: Mapping[str, str] = {}) -> str:
        """The job's command line, with the storage path passed explicitly so the job writes where
        :meth:`run_directory` looks (it is part of the ``run`` section, which names leave out),
        and ``tags`` for its MLflow run (the flow run's, like every stage's)."""
        storage = self.run_directory().url.rsplit("/", 1)[0]
        args = ["python", "-m", "pipelines.train", "--data", self.dataset, "--model", self.model]
        for override in [*self.overrides, f"run.storage_path={storage}"]:
            args += ["--set", override]
        for key, value in tags.items():
            args += ["--tag", f"{key}={value}"]
        args += ["--parent-run-id", parent_run_id, "--no-register"]
        return shlex.join(args)


def finished_run(run_dir: RunDirectory) -> TrainResult | None:
    """The run's result when it has finished (``FINISHED.json``), else None."""
    record = run_dir.read_json(FINISHED_FILE)
    return None if record is None else TrainResult.model_validate(record)


def already_finished(job: TrainJob) -> TrainResult | None:
    """The result of the job's run when an earlier submission finished it: no job is needed."""
    result = finished_run(job.run_directory())
    return None if result is None else result.model_copy(update={"already_finished": True})


def connect_jobs(address: str) -> JobSubmissionClient:
    """A jobs API client; an unreachable address raises :class:`RayJobsUnreachable` naming it."""
    try:
        return JobSubmissionClient(address)
    except ConnectionError as err:
        raise RayJobsUnreachable(
            f"cannot reach the Ray jobs API at {address} (RAY_API_SERVER_ADDRESS): {err}"
        ) from None


def submit_train_job(
    address: str, job: TrainJob, parent_run_id: str, metadata: Mapping[str, str]
) -> str:
    """Submit the training job (``metadata`` tags it, e.g. with the flow run); its submission id,
    chosen here so that the job's MLflow run is tagged with it too."""
    env = {PARENT_RUN_ENV: parent_run_id, "MLFLOW_TRACKING_URI": mlflow_tracking_uri()}
    submission_id = f"elmo-train-{uuid.uuid4().hex[:12]}"
    tags = {**metadata, SUBMISSION_TAG: submission_id}
    return connect_jobs(address).submit_job(
        entrypoint=job.entrypoint(parent_run_id, tags),
        submission_id=submission_id,
        runtime_env={"env_vars": env},
        metadata={**metadata, "elmo.stage": "train"},
    )


def dashboard_url(address: str, job_id: str) -> str:
    """The job's page on the Ray dashboard that serves the jobs API at ``address``."""
    return f"{address.rstrip('/')}/#/jobs/{job_id}"


def wait_for_job(address: str, job_id: str, *, poll_s: float = POLL_S) -> str:
    """Block until the job ends; its logs on success, :class:`TrainJobFailed` otherwise."""
    client = connect_jobs(address)
    status = client.get_job_status(job_id)
    while not status.is_terminal():
        time.sleep(poll_s)
        status = client.get_job_status(job_id)
    logs = client.get_job_logs(job_id)
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        tail = "\n".join(logs.splitlines()[-LOG_TAIL_LINES:])
        raise TrainJobFailed(
            f"Ray job {job_id} at {address} ended {status.value}: {info.message}\n"
            f"--- last {LOG_TAIL_LINES} log lines ---\n{tail}"
        )
    return logs


def await_train_job(address: str, job_id: str, job: TrainJob) -> TrainResult:
    """Wait for the submitted job and read its result from the run directory."""
    wait_for_job(address, job_id)
    run_dir = job.run_directory()
    result = finished_run(run_dir)
    if result is None:
        raise RuntimeError(f"Ray job {job_id} succeeded but left no FINISHED.json in {run_dir.url}")
    return result
