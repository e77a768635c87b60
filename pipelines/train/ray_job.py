"""Training as a Ray Job: ``python -m pipelines.train`` on the cluster behind the jobs API.

The resolved config travels as data, ``job_config.json`` in the run directory with the run's name
and storage pinned; the job's MLflow run nests under the caller's parent run, and its outcome is
the run directory's ``FINISHED.json``.
"""

from __future__ import annotations

import logging
import shlex
import time
import uuid
from collections.abc import Mapping

from ray.job_submission import JobStatus, JobSubmissionClient

from elmo_core.location import open_url
from pipelines.common.handoff import TrainResult
from pipelines.common.settings import mlflow_tracking_uri
from pipelines.tracking.flow_runs import tag_run
from pipelines.tracking.stage_runs import PARENT_RUN_ENV, STAGE_TAG
from pipelines.train.job_config import TrainJobConfig
from pipelines.train.preflight import TrainPlan
from pipelines.train.run_directory import RUN_DIR_TAG

log = logging.getLogger(__name__)

JOB_CONFIG_FILE = "job_config.json"  # in the run directory: the config the job trains with
LOG_TAIL_LINES = 60
POLL_S = 2.0
SUBMIT_RETRY_S = (5.0, 20.0, 60.0)  # waits before each new try when the jobs API is unreachable
SUBMISSION_TAG = "ray.job_submission_id"  # on the caller's parent run and the job's train run


class RayJobsUnreachable(ConnectionError):
    """The Ray jobs API did not answer (a transient failure: the submission is retried)."""


class TrainJobFailed(RuntimeError):
    """The training job ended in FAILED or STOPPED; the message holds its log tail."""


def train_as_job(
    address: str,
    cfg: TrainJobConfig,
    plan: TrainPlan,
    *,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> TrainResult:
    """Train the planned run as a Ray Job at ``address``, wait for it, and read its result."""
    job_config = write_job_config(cfg, plan)
    submission_id = f"elmo-train-{uuid.uuid4().hex[:12]}"
    all_tags = {**(tags or {}), SUBMISSION_TAG: submission_id}
    env = {"MLFLOW_TRACKING_URI": mlflow_tracking_uri()}
    if parent_run_id is not None:
        env[PARENT_RUN_ENV] = parent_run_id
    submit_job(
        address,
        job_entrypoint(job_config, plan, parent_run_id, all_tags),
        submission_id=submission_id,
        env=env,
        metadata={**(tags or {}), STAGE_TAG: "train", RUN_DIR_TAG: plan.run_dir.url},
    )
    if parent_run_id is not None:
        tag_run(parent_run_id, {SUBMISSION_TAG: submission_id})
    print(f"[train] {plan.name}: Ray job {submission_id}, {dashboard_url(address, submission_id)}")
    wait_for_job(address, submission_id)
    result = plan.finished()
    if result is None:
        raise RuntimeError(
            f"Ray job {submission_id} succeeded but left no FINISHED.json in {plan.run_dir.url}"
        )
    return result


def write_job_config(cfg: TrainJobConfig, plan: TrainPlan) -> str:
    """``cfg`` as the job reads it, into the run directory: named and stored as planned here
    (``run.name`` and ``run.storage_path`` pinned), so the job trains exactly this run."""
    storage = plan.run_dir.url.rsplit("/", 1)[0]
    run = cfg.run.model_copy(update={"name": plan.name, "storage_path": storage})
    pinned = cfg.model_copy(update={"run": run})
    plan.run_dir.write_json(JOB_CONFIG_FILE, pinned.model_dump(mode="json"))
    return plan.run_dir.join(JOB_CONFIG_FILE)


def read_job_config(url: str) -> TrainJobConfig:
    """The config a driver wrote with :func:`write_job_config` (a path or any fsspec URL)."""
    with open_url(url, "rt", encoding="utf-8") as handle:
        return TrainJobConfig.model_validate_json(handle.read())


def job_entrypoint(
    job_config: str, plan: TrainPlan, parent_run_id: str | None, tags: Mapping[str, str]
) -> str:
    """The job's command line: the train command on the written config and the planned dataset
    and start, with ``tags`` for its MLflow run; evaluation and registration are the caller's."""
    args = ["python", "-m", "pipelines.train", "--job-config", job_config, "--data", plan.data]
    if plan.init_from is not None:
        args += ["--init-from", plan.init_from.location]
        if plan.init_from.options is not None:
            args += ["--init-options", plan.init_from.options]
    for key, value in tags.items():
        args += ["--tag", f"{key}={value}"]
    if parent_run_id is not None:
        args += ["--parent-run-id", parent_run_id]
    return shlex.join([*args, "--no-register"])


def connect_jobs(address: str) -> JobSubmissionClient:
    """A jobs API client; an unreachable address raises :class:`RayJobsUnreachable` naming it."""
    try:
        return JobSubmissionClient(address)
    except ConnectionError as err:
        raise RayJobsUnreachable(
            f"cannot reach the Ray jobs API at {address} (RAY_API_SERVER_ADDRESS): {err}"
        ) from None


def submit_job(
    address: str,
    entrypoint: str,
    *,
    submission_id: str,
    env: Mapping[str, str],
    metadata: Mapping[str, str],
) -> None:
    """Submit ``entrypoint``, trying again after :data:`SUBMIT_RETRY_S` while the jobs API is
    unreachable (it may be restarting)."""
    for wait_s in (*SUBMIT_RETRY_S, None):
        try:
            client = connect_jobs(address)
        except RayJobsUnreachable as unreachable:
            if wait_s is None:
                raise
            log.warning("%s; trying again in %.0f s", unreachable, wait_s)
            time.sleep(wait_s)
            continue
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env={"env_vars": dict(env)},
            metadata=dict(metadata),
        )
        return


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
