"""The train stage: distributed biLM pretraining on Ray Train (TorchTrainer, DDP).

:func:`train` plans the run once (:mod:`pipelines.train.preflight`) and returns a finished run as
it is; otherwise it trains here or as a Ray Job that runs the same worker function, resuming from
the newest complete checkpoint. ``elmo train`` (:mod:`pipelines.cli`) then hands the run's best
model (lowest validation perplexity) to the evaluate and registry stages' functions, the ones a
flow's tasks call.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import mlflow
import ray.train
from ray.train.torch import TorchTrainer

from elmo_core.errors import ConfigError
from elmo_core.model.serialization import MODEL_DIR
from pipelines.common.handoff import DATASET_TAG, TrainResult
from pipelines.common.ray_cluster import connect_ray, cpus_available
from pipelines.common.settings import RAY_JOBS_ENV, mlflow_tracking_uri
from pipelines.tracking.datasets import log_dataset
from pipelines.tracking.flow_runs import HEALTH_TAG, TOTAL_STEPS_TAG
from pipelines.tracking.stage_runs import (
    DESCRIPTION_TAG,
    find_run,
    git_commit,
    log_config,
    stage_run,
    stage_run_name,
)
from pipelines.train.checkpoint import CheckpointStore, StoredCheckpoint
from pipelines.train.job_config import TrainJobConfig, Where
from pipelines.train.preflight import TrainPlan, plan_training
from pipelines.train.ray_job import SUBMISSION_TAG, dashboard_url, train_as_job
from pipelines.train.run_directory import (
    BEST_DIR,
    FINISHED_FILE,
    FINISHED_TAG,
    MODEL_DIR_TAG,
    RUN_DIR_TAG,
    RUN_ID_FILE,
    RunDirectory,
)
from pipelines.train.supervision import supervise
from pipelines.train.worker import WorkerConfig, train_loop_per_worker

log = logging.getLogger(__name__)

FAIL_ONCE_ENV = "ELMO_TRAIN_FAIL_ONCE"  # test hook forwarded to the workers: "rank:step:marker"
RAY_TRAIN_DIR = "ray"  # Ray Train's own records in the run directory


class StartedRun(NamedTuple):
    """A training run's MLflow run once it exists, and its Ray job's page where it runs as one."""

    run_id: str
    ray_job: tuple[str, str] | None  # (submission id, dashboard URL)


def started_run(plan: TrainPlan) -> StartedRun | None:
    """The MLflow run of ``plan``'s training once it exists (None before): what a flow links
    while it follows the training."""
    run = find_run(stage_run_name("train", plan.name), "train")
    if run is None:
        return None
    job_id = run.data.tags.get(SUBMISSION_TAG)
    address = os.environ.get(RAY_JOBS_ENV, "")
    return StartedRun(run.info.run_id, (job_id, dashboard_url(address, job_id)) if job_id else None)


def train(
    cfg: TrainJobConfig,
    data: str,
    *,
    where: Where = "local",
    init_from: str | None = None,
    init_options: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    console: bool = True,
    plan: TrainPlan | None = None,
) -> TrainResult:
    """Train (or resume, or recognise as finished) the run that ``cfg`` and ``data`` define.

    ``where``: ``local`` trains from this process, on ``RAY_ADDRESS`` or a local Ray; ``ray-job``
    submits it to the Ray jobs API at ``RAY_API_SERVER_ADDRESS`` and waits. Everything the user
    gave is checked here first (:mod:`pipelines.train.preflight`), unless the caller did and
    passes its ``plan`` (a flow, which names the run before it starts). The MLflow run ends
    FINISHED, FAILED or KILLED with the training. ``console``: rank 0 prints its progress lines
    (a flow, which logs them from the run's metrics, turns that off).
    """
    started = time.perf_counter()
    plan = plan or plan_training(cfg, data, init_from, init_options)
    finished = plan.finished()
    if finished is not None:
        log.info("run %s already finished: %s", plan.name, plan.run_dir.url)
        return finished.model_copy(update={"already_finished": True})
    if where == "ray-job":
        address = os.environ.get(RAY_JOBS_ENV)
        if not address:
            raise ConfigError(f"training as a Ray job needs {RAY_JOBS_ENV}", key="where")
        return train_as_job(address, cfg, plan, parent_run_id=parent_run_id, tags=tags)
    _check_cpus(cfg)
    with _tracked_run(cfg, plan, parent_run_id, tags) as run_id:
        worker_cfg = _worker_config(cfg, plan, run_id).model_copy(update={"console": console})
        mlflow.set_tag(TOTAL_STEPS_TAG, str(worker_cfg.total_steps))
        connect_ray()
        supervise(
            lambda resume: _trainer(cfg, plan, worker_cfg, resume),
            CheckpointStore(plan.run_dir),
            run_name=plan.name,
            max_failures=cfg.run.max_failures,
        )
        return _finish(worker_cfg, plan.run_dir, time.perf_counter() - started)


def _check_cpus(cfg: TrainJobConfig) -> None:
    """Workers that ask for more CPUs than the Ray has would wait for them for ever."""
    wanted, cpus = cfg.run.cpus_per_worker * cfg.run.num_workers, cpus_available()
    if cpus is not None and wanted > cpus:
        raise ConfigError(
            f"{cfg.run.num_workers} worker(s) × {cfg.run.cpus_per_worker} CPUs is more than the "
            f"{cpus:g} CPUs this Ray has",
            key="run.cpus_per_worker",
        )


def _worker_config(cfg: TrainJobConfig, plan: TrainPlan, run_id: str) -> WorkerConfig:
    from elmo_core.data.batching import training_steps

    return WorkerConfig(
        job=cfg,
        data=plan.data,
        run_dir=plan.run_dir.url,
        run_name=plan.name,
        total_steps=training_steps(plan.manifest, cfg.train, cfg.run.num_workers),
        validation_windows=plan.validation_windows,
        mlflow_tracking_uri=mlflow_tracking_uri(),  # absolute: workers must reach the same store
        mlflow_run_id=run_id,
        init_from=plan.init_from,
        fail_once=os.environ.get(FAIL_ONCE_ENV),
    )


def _trainer(
    cfg: TrainJobConfig, plan: TrainPlan, worker_cfg: WorkerConfig, resume: StoredCheckpoint | None
) -> TorchTrainer:
    """The Ray Train side: scaling. Restarts are :func:`supervise`'s, checkpoints the store's."""
    resumed = worker_cfg.model_copy(update={"resume_step": None if resume is None else resume.step})
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=resumed.model_dump(mode="json"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.run.num_workers,
            use_gpu=cfg.run.use_gpu,
            resources_per_worker={"CPU": cfg.run.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=RAY_TRAIN_DIR,  # Ray Train's own records, beside ours in the run directory
            storage_path=plan.run_dir.url,
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),  # no start-up chatter
            failure_config=ray.train.FailureConfig(max_failures=0, max_preemption_failures=0),  # type: ignore[call-arg]  # Train V2's
        ),
    )


@contextmanager
def _tracked_run(
    cfg: TrainJobConfig,
    plan: TrainPlan,
    parent_run_id: str | None,
    tags: dict[str, str] | None,
) -> Iterator[str]:
    """The run's MLflow run, open while it trains: the one recorded in the run directory (or
    found by name), else a new one with the config as params."""
    run_name = stage_run_name("train", plan.name)
    run_id = _recorded_run_id(plan, run_name)
    if run_id is not None:
        with stage_run("train", run_name=run_name, run_id=run_id):
            yield run_id
        return
    all_tags = {DATASET_TAG: plan.data, RUN_DIR_TAG: plan.run_dir.url, **(tags or {})}
    if plan.init_from is not None:
        all_tags |= plan.init_from.tags
    with stage_run("train", run_name=run_name, parent_run_id=parent_run_id, tags=all_tags) as run:
        log_config(cfg)
        commit = git_commit()
        mlflow.log_params(
            {
                "dataset.url": plan.data,
                "dataset.manifest_sha256": plan.dataset_sha256,
                **({"git_commit": commit} if commit else {}),
                **({"init_from": plan.init_from.location} if plan.init_from else {}),
            }
        )
        log_dataset(plan.data, "training")
        plan.run_dir.write_json(RUN_ID_FILE, {"run_id": run.info.run_id})
        yield run.info.run_id


def _recorded_run_id(plan: TrainPlan, run_name: str) -> str | None:
    recorded = plan.run_dir.read_json(RUN_ID_FILE)
    if recorded is not None and _run_exists(recorded["run_id"]):
        return str(recorded["run_id"])
    existing = find_run(run_name, "train")
    if existing is None:
        return None
    plan.run_dir.write_json(RUN_ID_FILE, {"run_id": existing.info.run_id})
    return str(existing.info.run_id)


def _run_exists(run_id: str) -> bool:
    try:
        mlflow.set_tracking_uri(mlflow_tracking_uri())
        mlflow.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return False
    return True


def _finish(worker_cfg: WorkerConfig, run_dir: RunDirectory, seconds: float) -> TrainResult:
    """Copy the final model out of the last checkpoint, write FINISHED.json, log the outcome
    (the best validation perplexity in the description: the curve is rank 0's)."""
    store = CheckpointStore(run_dir)
    final = store.newest()
    record = {} if final is None else store.record(final)
    if final is None or not record.get("final"):
        raise RuntimeError(f"training run {worker_cfg.run_name} ended without its final checkpoint")
    run_dir.copy(f"{final.name}/{MODEL_DIR}", MODEL_DIR)
    best = record["best_perplexity"]
    outcome = TrainResult(
        run_name=worker_cfg.run_name,
        run_dir=run_dir.url,
        model_dir=run_dir.join(MODEL_DIR),
        best_model_dir=run_dir.join(BEST_DIR) if run_dir.exists(BEST_DIR) else None,
        mlflow_run_id=worker_cfg.mlflow_run_id,
        steps=final.step,
        total_steps=worker_cfg.total_steps,
        resumed_from_step=int(record["resumed_from_step"]),
        best_perplexity=None if math.isnan(best) else float(best),
        best_step=record.get("best_step") or None,  # 0, or absent in older runs: no best model
        stopped_early=bool(record["stopped_early"]),
        seconds=seconds,
    )
    # The best validation perplexity is one number: it is in the description, not a metric whose
    # chart would be a single dot.
    mlflow.log_dict(outcome.model_dump(mode="json"), "train_result.json")
    models = f"final model (step {outcome.steps}) `{outcome.model_dir}`"
    if outcome.best_model_dir is not None:
        at = f" (step {outcome.best_step})" if outcome.best_step else ""
        models = f"best model{at} `{outcome.best_model_dir}`; {models}"
    warning = mlflow.get_run(worker_cfg.mlflow_run_id).data.tags.get(HEALTH_TAG)
    models += f". Warned at {warning}" if warning else ""
    mlflow.set_tags(
        {
            MODEL_DIR_TAG: outcome.model_dir,
            FINISHED_TAG: "true",
            DESCRIPTION_TAG: f"{outcome.summary()}. {models}.",
        }
    )
    run_dir.write_json(FINISHED_FILE, outcome.model_dump(mode="json"))
    return outcome
