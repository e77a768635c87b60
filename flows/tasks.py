"""Prefect tasks over the pipeline stages: each a thin call with paths in and paths out.

Retries are kept for what fails transiently — a corpus download, a Ray job submission — and left
off the stages whose failures are the user's (a bad config fails the same way twice) or that have
their own recovery (Ray Train restarts workers from the last checkpoint; re-running the flow
resumes a stopped run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.client.schemas.objects import TaskRun
from prefect.runtime import flow_run
from prefect.states import State

from elmo_core.data.reader import load_manifest
from elmo_core.errors import ElmoError
from elmo_core.tasks import load_task_config
from flows.artifacts import (
    dataset_rows,
    perplexity_rows,
    publish,
    summary_markdown,
    task_rows,
)
from flows.cache import PrepareCachePolicy, dataset_exists
from flows.params import DataParams, TrainingParams
from pipelines.adapt import stage as adapt_stage
from pipelines.adapt.stage import AdaptResult
from pipelines.common.flow_runs import FLOW_RUN_TAG
from pipelines.common.settings import RAY_JOBS_ENV, elmo_home
from pipelines.evaluate import stage as evaluate_stage
from pipelines.evaluate.result import EvaluationResult
from pipelines.prepare import stage as prepare_stage
from pipelines.registry import register as register_stage
from pipelines.registry.register import RegisteredBiLM
from pipelines.train import ray_job
from pipelines.train import stage as train_stage
from pipelines.train.ray_job import TrainJob
from pipelines.train.stage import TrainResult


def _transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry network and OS failures; never a user's error (those name what to fix)."""
    try:
        state.result()
    except ElmoError:
        return False
    except (OSError, TimeoutError):
        return True
    except Exception:
        return False
    return False


def result_storage() -> Path:
    """Persisted task results (the prepare cache) live under ``ELMO_HOME``, read at run time."""
    return elmo_home() / "prefect" / "results"


def flow_tags() -> dict[str, str]:
    return {FLOW_RUN_TAG: str(flow_run.get_id() or "")}


# --- prepare ------------------------------------------------------------------------------------


@task(
    name="prepare",
    cache_policy=PrepareCachePolicy(),
    persist_result=True,
    retries=2,
    retry_delay_seconds=[10, 60],
    retry_condition_fn=_transient,
)
def _prepare(data: DataParams) -> str:
    return prepare_stage.prepare(
        data.prepare_config(), data.corpus, data.dataset_dir(), overwrite=data.overwrite
    ).dataset


def prepare(data: DataParams) -> str:
    """The dataset directory; cached across flow runs, rebuilt when its manifest is gone."""
    missing = not dataset_exists(data.dataset_dir())
    return _prepare.with_options(result_storage=result_storage(), refresh_cache=missing)(data)


# --- train --------------------------------------------------------------------------------------


@task(name="train")
def _train_in_process(dataset: str, training: TrainingParams, parent_run_id: str) -> TrainResult:
    return train_stage.train(
        training.job_config(), dataset, parent_run_id=parent_run_id, tags=flow_tags()
    )


@task(
    name="submit-train-job",
    retries=3,
    retry_delay_seconds=[5, 20, 60],
    retry_condition_fn=_transient,
)
def _submit_train_job(job: TrainJob, parent_run_id: str) -> str:
    return ray_job.submit_train_job(os.environ[RAY_JOBS_ENV], job, parent_run_id, flow_tags())


@task(name="train")
def _await_train_job(job_id: str, job: TrainJob) -> TrainResult:
    return ray_job.await_train_job(os.environ[RAY_JOBS_ENV], job_id, job)


def train(dataset: str, training: TrainingParams, parent_run_id: str) -> TrainResult:
    """Train in process (local Ray / RAY_ADDRESS) or as a Ray Job; a finished run is reused."""
    if training.resolved_mode() == "local":
        return _train_in_process(dataset, training, parent_run_id)
    job = training.train_job(dataset)
    finished = ray_job.already_finished(job)
    if finished is not None:
        return finished
    job_id = _submit_train_job(job, parent_run_id)
    return _await_train_job(job_id, job)


# --- evaluate, register, adapt --------------------------------------------------------------------


@task(name="evaluate")
def evaluate(run: TrainResult, dataset: str, parent_run_id: str) -> EvaluationResult:
    """Full-softmax heldout perplexity of the final model."""
    return evaluate_stage.evaluate(run.model_dir, dataset, parent_run_id=parent_run_id)


@task(name="register")
def register(
    run: TrainResult, dataset: str, evaluation: EvaluationResult, name: str, parent_run_id: str
) -> RegisteredBiLM:
    """The run's version of ``name``: registered and judged by the champion policy once per
    training run (a re-run gets the same version and decision back)."""
    return register_stage.register(
        run.model_dir,
        dataset,
        evaluation=evaluation,
        run_id=run.mlflow_run_id,
        name=name,
        parent_run_id=parent_run_id,
        tags=flow_tags(),
    )


def check_tasks(paths: list[str]) -> None:
    """Load every task config now, so a bad path or key fails before training starts."""
    for path in paths:
        load_task_config(path)


@task(name="adapt")
def adapt(
    bilm: str, task_paths: list[str], parent_run_id: str, bilm_options: str | None = None
) -> list[AdaptResult]:
    """One adaptation job per task (in parallel on Ray), each an ``elmo-<task>`` model."""
    if not task_paths:
        return []
    configs = [load_task_config(path) for path in task_paths]
    return adapt_stage.adapt(
        configs, bilm, bilm_options=bilm_options, parent_run_id=parent_run_id, tags=flow_tags()
    )


# --- summary ------------------------------------------------------------------------------------


@task(name="summarize")
def summarize(
    dataset: str,
    run: TrainResult,
    evaluation: EvaluationResult,
    model: RegisteredBiLM,
    results: list[AdaptResult],
    parent_run_id: str,
) -> None:
    """Tables (dataset, perplexities, tasks) and a markdown summary linking to MLflow."""
    run_ids = {"flow (parent)": parent_run_id, "train": run.mlflow_run_id}
    if evaluation.run_id:
        run_ids["evaluate"] = evaluation.run_id
    run_ids.update({f"adapt {r.task}": r.run_id for r in results})
    tables = {
        "dataset": dataset_rows(load_manifest(dataset)),
        "perplexity": perplexity_rows(evaluation),
        "tasks": task_rows(results),
    }
    publish("pretrain", tables, summary_markdown(run, evaluation, model, results, run_ids))
