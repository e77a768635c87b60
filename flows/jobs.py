"""Training as a Ray Job: the same ``python -m pipelines.train`` a user submits by hand.

The flow submits the command line a user would type after ``ray job submit --``, with the flow's
MLflow parent run in the job's environment (``ELMO_MLFLOW_PARENT_RUN_ID``) and its tracking URI, so
the training run nests under the flow's run wherever the job lands. Token auth is Ray's own: the
client adds the bearer token when ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` are set (what
``infra/local/stack.py`` exports).

The run directory is where the flow finds the outcome: the job writes ``FINISHED.json`` there
(issue 4's run naming makes its name a function of config and data), so the flow reads the
:class:`~pipelines.train.stage.TrainResult` back from it — and skips the job entirely when a
previous flow run already finished it.
"""

from __future__ import annotations

import shlex
import time

from ray.job_submission import JobStatus, JobSubmissionClient

from flows.params import TrainingParams
from pipelines.common.settings import mlflow_tracking_uri
from pipelines.common.tracking import PARENT_RUN_ENV
from pipelines.train.checkpoints import FINISHED_FILE, RunDirectory
from pipelines.train.config import manifest_sha256, run_name, storage_root
from pipelines.train.stage import TrainResult

LOG_TAIL_LINES = 60
POLL_S = 2.0


class RayJobsUnreachable(ConnectionError):
    """The Ray jobs API did not answer (a transient failure: the submission is retried)."""


class TrainJobFailed(RuntimeError):
    """The training job ended in FAILED or STOPPED; the message holds its log tail."""


def run_directory(training: TrainingParams, dataset: str) -> RunDirectory:
    """Where the run that ``training`` and ``dataset`` define lives (named as train names it)."""
    cfg = training.job_config()
    return RunDirectory(f"{storage_root(cfg.run)}/{run_name(cfg, manifest_sha256(dataset))}")


def finished_run(run_dir: RunDirectory) -> TrainResult | None:
    """The run's result when it has finished (``FINISHED.json``), else None."""
    record = run_dir.read_json(FINISHED_FILE)
    return None if record is None else TrainResult.model_validate(record)


def train_entrypoint(
    training: TrainingParams, dataset: str, run_dir: RunDirectory, parent_run_id: str
) -> str:
    """The job's command line: ``python -m pipelines.train`` with the flow's config and storage.

    The storage path is passed explicitly so the job writes where the flow looks; it is part of
    the ``run`` section, which the run name leaves out.
    """
    storage = run_dir.url.rsplit("/", 1)[0]
    args = ["python", "-m", "pipelines.train", "--data", dataset, "--model", training.model]
    for override in [*training.train_overrides(), f"run.storage_path={storage}"]:
        args += ["--set", override]
    args += ["--parent-run-id", parent_run_id, "--no-register"]
    return shlex.join(args)


def connect_jobs(address: str) -> JobSubmissionClient:
    """A jobs API client; an unreachable address raises :class:`RayJobsUnreachable` naming it."""
    try:
        return JobSubmissionClient(address)
    except ConnectionError as err:
        raise RayJobsUnreachable(
            f"cannot reach the Ray jobs API at {address} (RAY_API_SERVER_ADDRESS): {err}"
        ) from None


def submit_train_job(
    address: str, training: TrainingParams, dataset: str, parent_run_id: str, flow_run_id: str
) -> str:
    """Submit the training job; returns its submission id."""
    client = connect_jobs(address)
    run_dir = run_directory(training, dataset)
    entrypoint = train_entrypoint(training, dataset, run_dir, parent_run_id)
    env = {PARENT_RUN_ENV: parent_run_id, "MLFLOW_TRACKING_URI": mlflow_tracking_uri()}
    return client.submit_job(
        entrypoint=entrypoint,
        runtime_env={"env_vars": env},
        metadata={"prefect.flow_run_id": flow_run_id, "elmo.stage": "train"},
    )


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
