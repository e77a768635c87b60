"""The train stage: distributed biLM pretraining on Ray Train (TorchTrainer, DDP).

    elmo train --data DATASET [--model PRESET|FILE] [--config FILE.yaml] [--set key=value ...]
               [--init-from SOURCE [--init-options OPTIONS.json]] [--parent-run-id ID]
               [--no-register]
    python -m pipelines.train ...                               # the same main
    ray job submit --working-dir . -- python -m pipelines.train ...
    train(cfg, data) -> TrainResult                             # what flows call

The driver joins the cluster named by ``RAY_ADDRESS`` (or starts a local Ray), names the run
``bilm-<hash>`` from the resolved config and the dataset manifest, opens its MLflow run, and hands
:func:`pipelines.train.worker.train_loop_per_worker` to a TorchTrainer. The run lives in
``storage_path/name``: Ray Train keeps the checkpoints there, so running the same command again
resumes a stopped run from its latest checkpoint, and a run with ``FINISHED.json`` is not trained
again. ``main`` then evaluates the final model on the heldout split and registers it as a new
version of the MLflow model (``--no-register`` skips both).
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Annotated

import mlflow
import ray.train
import typer
from pydantic import BaseModel
from ray.train.torch import TorchTrainer

from elmo_core.data.reader import load_manifest
from elmo_core.errors import ConfigError
from pipelines.common.cli_runner import run_command
from pipelines.common.ray_cluster import connect_ray
from pipelines.common.settings import mlflow_tracking_uri
from pipelines.common.tracking import find_run, git_commit, log_config, stage_run
from pipelines.models.bilm_loader import OPTIONS_HELP, SOURCE_HELP, BiLMReference, resolve_bilm
from pipelines.train.checkpoints import (
    BEST_DIR,
    FINISHED_FILE,
    MODEL_DIR,
    RUN_ID_FILE,
    RunDirectory,
)
from pipelines.train.config import (
    TrainJobConfig,
    manifest_sha256,
    resolve_train_config,
    run_name,
    storage_root,
)
from pipelines.train.loop import WorkerConfig
from pipelines.train.worker import train_loop_per_worker

log = logging.getLogger(__name__)

FAIL_ONCE_ENV = "ELMO_TRAIN_FAIL_ONCE"  # test hook forwarded to the workers: "rank:step:marker"


class TrainResult(BaseModel):
    """What a finished run produced; also the content of its ``FINISHED.json``."""

    run_name: str
    run_dir: str
    model_dir: str  # the final model, our format
    best_model_dir: str | None  # the model with the best validation perplexity
    mlflow_run_id: str
    steps: int
    total_steps: int
    resumed_from_step: int
    best_perplexity: float | None
    stopped_early: bool
    seconds: float
    already_finished: bool = False  # True when this call found FINISHED.json and did nothing


def train(
    cfg: TrainJobConfig,
    data: str,
    *,
    init_from: str | None = None,
    init_options: str | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> TrainResult:
    """Train (or resume, or recognise as finished) the run that ``cfg`` and ``data`` define."""
    started = time.perf_counter()
    dataset_sha256 = manifest_sha256(data)
    source = None
    if init_from is not None:  # pinned here (an alias to its version); workers load the pin
        source = resolve_bilm(init_from, init_options, options_key="init_options")
    name = run_name(cfg, dataset_sha256, None if source is None else source.location)
    run_dir = RunDirectory(f"{storage_root(cfg.run)}/{name}")
    finished = run_dir.read_json(FINISHED_FILE)
    if finished is not None:
        log.info("run %s already finished: %s", name, run_dir.url)
        return TrainResult.model_validate({**finished, "already_finished": True})
    run_id = _open_mlflow_run(cfg, data, name, run_dir, dataset_sha256, source, parent_run_id, tags)
    worker_cfg = _worker_config(cfg, data, name, run_dir, run_id, source)
    connect_ray()
    result = _trainer(cfg, name, worker_cfg).fit()  # [ray] resumes from storage_path/name
    return _finish(result, worker_cfg, run_dir, time.perf_counter() - started)


def validation_windows(data: str, cfg: TrainJobConfig) -> int:
    """Windows of B × T that hold about ``validation_sentences`` heldout sentences.

    A sentence of n tokens fills n + 1 positions (bilm-tf's stream batching).
    """
    heldout = load_manifest(data).split("heldout")
    if heldout.num_sentences == 0:
        raise ConfigError(
            "the dataset's heldout split is empty: nothing to validate on",
            key="train.validation_sentences",
        )
    per_sentence = (heldout.num_tokens + heldout.num_sentences) / heldout.num_sentences
    sentences = min(cfg.train.validation_sentences, heldout.num_sentences)
    per_window = cfg.train.batch_size * cfg.train.unroll_steps
    return max(1, math.ceil(sentences * per_sentence / per_window))


def _worker_config(
    cfg: TrainJobConfig,
    data: str,
    name: str,
    run_dir: RunDirectory,
    run_id: str,
    init_from: BiLMReference | None,
) -> WorkerConfig:
    from elmo_core.data.batching import training_steps

    return WorkerConfig(
        job=cfg,
        data=data,
        run_dir=run_dir.url,
        run_name=name,
        total_steps=training_steps(load_manifest(data), cfg.train, cfg.run.num_workers),
        validation_windows=validation_windows(data, cfg),
        mlflow_tracking_uri=mlflow_tracking_uri(),  # absolute: workers must reach the same store
        mlflow_run_id=run_id,
        init_from=init_from,
        fail_once=os.environ.get(FAIL_ONCE_ENV),
    )


def _trainer(cfg: TrainJobConfig, name: str, worker_cfg: WorkerConfig) -> TorchTrainer:
    """The Ray Train side: scaling, storage (= resumption) and fault tolerance."""
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=worker_cfg.model_dump(mode="json"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.run.num_workers,
            use_gpu=cfg.run.use_gpu,
            resources_per_worker={"CPU": cfg.run.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=storage_root(cfg.run),
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.run.checkpoints_to_keep),
        ),
    )


def _open_mlflow_run(
    cfg: TrainJobConfig,
    data: str,
    name: str,
    run_dir: RunDirectory,
    dataset_sha256: str,
    init_from: BiLMReference | None,
    parent_run_id: str | None,
    tags: dict[str, str] | None,
) -> str:
    """The run's MLflow run: the one recorded in the run directory, else a new one with params."""
    recorded = run_dir.read_json(RUN_ID_FILE)
    if recorded is not None and _run_exists(recorded["run_id"]):
        return str(recorded["run_id"])
    existing = find_run(name, "train")
    if existing is not None:
        run_id = existing.info.run_id
    else:
        all_tags = {"elmo.dataset": data, "elmo.run_dir": run_dir.url, **(tags or {})}
        if init_from is not None:
            all_tags |= init_from.tags
        with stage_run("train", run_name=name, parent_run_id=parent_run_id, tags=all_tags) as run:
            log_config(cfg)
            mlflow.log_params(
                {
                    "dataset.url": data,
                    "dataset.manifest_sha256": dataset_sha256,
                    "git_commit": git_commit() or "unknown",
                    "init_from": "none" if init_from is None else init_from.location,
                }
            )
            run_id = run.info.run_id
    run_dir.write_json(RUN_ID_FILE, {"run_id": run_id})
    return run_id


def _run_exists(run_id: str) -> bool:
    try:
        mlflow.set_tracking_uri(mlflow_tracking_uri())
        mlflow.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return False
    return True


def _finish(
    result: ray.train.Result, worker_cfg: WorkerConfig, run_dir: RunDirectory, seconds: float
) -> TrainResult:
    """Copy the final model out of the last checkpoint, write FINISHED.json, log the outcome."""
    if result.checkpoint is None:
        raise RuntimeError(f"training run {worker_cfg.run_name} reported no checkpoint")
    with result.checkpoint.as_directory() as directory:
        run_dir.put_directory(Path(directory) / MODEL_DIR, MODEL_DIR)
    metrics = result.metrics or {}
    best = metrics.get("best_perplexity")
    has_best = run_dir.fs.exists(f"{run_dir.path}/{BEST_DIR}")
    outcome = TrainResult(
        run_name=worker_cfg.run_name,
        run_dir=run_dir.url,
        model_dir=run_dir.join(MODEL_DIR),
        best_model_dir=run_dir.join(BEST_DIR) if has_best else None,
        mlflow_run_id=worker_cfg.mlflow_run_id,
        steps=int(metrics.get("step", 0)),
        total_steps=worker_cfg.total_steps,
        resumed_from_step=int(metrics.get("resumed_from_step", 0)),
        best_perplexity=None if best is None or math.isnan(best) else float(best),
        stopped_early=bool(metrics.get("stopped_early", False)),
        seconds=seconds,
    )
    with stage_run("train", run_name=worker_cfg.run_name, run_id=worker_cfg.mlflow_run_id):
        mlflow.log_dict(outcome.model_dump(mode="json"), "train_result.json")
        mlflow.set_tags({"elmo.model_dir": outcome.model_dir, "elmo.finished": "true"})
    run_dir.write_json(FINISHED_FILE, outcome.model_dump(mode="json"))
    return outcome


# --- command line --------------------------------------------------------------------------------


def train_command(
    data: Annotated[str, typer.Option(help="prepared dataset directory or URL")],
    model: Annotated[
        str | None, typer.Option(help="preset (tiny|small|medium|original) or file")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML with model/train/run sections")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="section.key=value")] = None,
    init_from: Annotated[str | None, typer.Option(help=f"start from this {SOURCE_HELP}")] = None,
    init_options: Annotated[str | None, typer.Option(help=OPTIONS_HELP)] = None,
    parent_run_id: Annotated[str | None, typer.Option(help="MLflow parent run")] = None,
    no_register: Annotated[
        bool, typer.Option("--no-register", help="skip evaluate+register")
    ] = False,
) -> None:
    """Pretrain a biLM on Ray Train; evaluate and register the final model."""
    cfg = resolve_train_config(model, config, set_ or [])
    result = train(
        cfg, data, init_from=init_from, init_options=init_options, parent_run_id=parent_run_id
    )
    verb = "already finished" if result.already_finished else "finished"
    typer.echo(
        f"{result.run_name} {verb}: {result.steps}/{result.total_steps} steps, best "
        f"validation perplexity {result.best_perplexity}, model → {result.model_dir}"
    )
    if no_register:
        return
    _evaluate_and_register(result, data, parent_run_id)


def _evaluate_and_register(result: TrainResult, data: str, parent_run_id: str | None) -> None:
    from pipelines.evaluate.stage import evaluate

    scores = evaluate(result.model_dir, data, parent_run_id=parent_run_id)
    typer.echo(
        f"heldout perplexity {scores.perplexity:.2f} (forward {scores.forward_perplexity:.2f}, "
        f"backward {scores.backward_perplexity:.2f}) on {scores.num_tokens} tokens"
    )
    from pipelines.registry.register import register

    registered = register(
        result.model_dir,
        data,
        evaluation=scores,
        run_id=result.mlflow_run_id,  # the version is logged into the training run, once
        parent_run_id=parent_run_id,
    )
    verb = "registered" if registered.newly_registered else "already registered as"
    decision = "" if registered.decision is None else f" ({registered.decision.reason})"
    typer.echo(f"{verb} {registered.uri}, alias {registered.alias}{decision}")


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.train``: the same command as ``elmo train``."""
    return run_command(train_command, argv)
