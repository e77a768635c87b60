"""The evaluate stage: full-softmax perplexity of a trained biLM on heldout shards.

The checkpoint is pinned here so every Ray task loads the same weights; the run records
``heldout_hash`` because the registry compares perplexities only on the same heldout data. A
training run's model, once scored, is not scored again: a re-run of the flow gets the finished
evaluation back (:func:`evaluate_trained`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlflow
import torch

import elmo_core
import pipelines.evaluate
from elmo_core.data.manifest import load_manifest
from elmo_core.data.reader import select_shards
from elmo_core.errors import DataError
from elmo_core.location import absolute_location
from elmo_core.perplexity import (
    PerplexitySums,
    Protocol,
    describe_trapped_rows,
    evaluate_perplexity,
)
from elmo_core.threads import fewer_threads_under_load
from pipelines.common.code_version import code_version, source_files
from pipelines.common.handoff import HandOn, TrainResult
from pipelines.evaluate.result import EvaluationResult
from pipelines.serving.bilm_loader import BiLMReference, load_bilm, resolve_bilm
from pipelines.tracking.datasets import log_dataset
from pipelines.tracking.stage_runs import (
    DESCRIPTION_TAG,
    REUSE_KEY_TAG,
    find_finished,
    location_name,
    reuse_key,
    stage_run,
    stage_run_name,
)

PERPLEXITY_TABLE = "perplexity.json"  # the evaluate run's table: each direction and their mean
RESULT_FILE = "evaluation.json"  # the run's EvaluationResult, what a re-run gets back


def evaluate_bilm(
    checkpoint: str,
    data: str,
    *,
    split: str = "heldout",
    files: Sequence[str] | None = None,
    protocol: Protocol = "batched",
    batch_size: int | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    workers: int | None = None,
    subject: str | None = None,
    key: str | None = None,
) -> EvaluationResult:
    """Perplexity of ``checkpoint`` on ``data``'s ``split``, tracked as an ``evaluate`` run
    (metrics named ``<split>_perplexity...``: "validation perplexity" is training's sample)
    named ``evaluate-<subject>`` (by default the checkpoint's :func:`location_name`). ``key``:
    the run's reuse key, tagged once it is complete."""
    files = list(files) if files else None
    data = absolute_location(data)  # Ray tasks run in another directory
    bilm = resolve_bilm(checkpoint)  # a bad source fails before any run or task starts
    heldout = heldout_hash(data, split, files)
    params = {
        "checkpoint": checkpoint,
        "data": data,
        "split": split,
        "protocol": protocol,
        "heldout_hash": heldout,
        **({"files": ",".join(files)} if files else {}),
        **({"batch_size": str(batch_size)} if batch_size is not None else {}),
    }
    with stage_run(
        "evaluate",
        run_name=stage_run_name("evaluate", subject or location_name(checkpoint)),
        parent_run_id=parent_run_id,
        tags={**bilm.tags, **(tags or {})},
    ) as run:
        mlflow.log_params(params)
        log_dataset(data, "evaluation")
        job = EvaluationPart(bilm, data, split, files, protocol, batch_size)
        num_tasks = _num_ray_tasks(workers)
        sums = _evaluate_on_ray(job, num_tasks) if num_tasks else evaluate_part(job)
        if not sums.num_tokens:
            raise DataError(f"no {split} tokens were scored (files {files})", path=data)
        result = EvaluationResult(
            forward_perplexity=sums.forward_perplexity,
            backward_perplexity=sums.backward_perplexity,
            perplexity=sums.perplexity,
            num_tokens=sums.num_tokens,
            split=split,
            files=files,
            protocol=protocol,
            heldout_hash=heldout,
            run_id=run.info.run_id,
            forward_trapped=sums.forward_trapped,
            backward_trapped=sums.backward_trapped,
            num_rows=sums.num_rows,
        )
        mlflow.log_metrics(
            result.metrics()
            | {
                f"{split}_predicted_tokens": sums.num_tokens,
                f"{split}_trapped_rows_forward": sums.forward_trapped,
                f"{split}_trapped_rows_backward": sums.backward_trapped,
            }
        )
        rows = result.rows()
        mlflow.log_table({key: [row[key] for row in rows] for key in rows[0]}, PERPLEXITY_TABLE)
        trapped = describe_trapped_rows(sums.forward_trapped, sums.backward_trapped, sums.num_rows)
        description = f"{bilm.location}: {result.summary()}, {protocol} protocol"
        mlflow.set_tag(DESCRIPTION_TAG, f"{description}. {trapped}" if trapped else description)
        mlflow.log_dict(result.model_dump(mode="json"), RESULT_FILE)
        if key is not None:
            mlflow.set_tag(REUSE_KEY_TAG, key)  # last: only a complete run is ever reused
    return result


def evaluate_trained(
    result: TrainResult,
    data: str,
    *,
    hand_on: HandOn = "best",
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> EvaluationResult:
    """The full-softmax heldout perplexity of the training run's model that ``hand_on`` picks
    (:meth:`~pipelines.common.handoff.TrainResult.handed_on`): what registers it. The run is
    named after the training run and tagged with which of its models it scored; when that model
    was scored before on the same heldout data by the same code, that run's result instead."""
    handed = result.handed_on(hand_on)
    key = reuse_key(
        {
            "train_run": result.mlflow_run_id,  # a finished run's models never change
            "model": handed.tags,
            "heldout_hash": heldout_hash(data, "heldout", None),
            "code": code_version(source_files(elmo_core, pipelines.evaluate)),
        }
    )
    finished = find_finished("evaluate", key)
    if finished is not None:
        stored = mlflow.artifacts.load_dict(f"runs:/{finished.info.run_id}/{RESULT_FILE}")
        return EvaluationResult.model_validate(stored)
    return evaluate_bilm(
        handed.model_dir,
        data,
        parent_run_id=parent_run_id,
        tags={**(tags or {}), **handed.tags},
        subject=result.run_name,
        key=key,
    )


def heldout_hash(data: str, split: str, files: Sequence[str] | None) -> str:
    """sha256 over the selected shards' sha256s, in manifest order."""
    shards = select_shards(load_manifest(data), split, files)
    return hashlib.sha256("\n".join(shard.sha256 for shard in shards).encode()).hexdigest()


@dataclass(frozen=True)
class EvaluationPart:
    """What one rank evaluates: the whole job description, so a Ray task needs nothing else."""

    bilm: BiLMReference  # pinned by the driver
    data: str
    split: str
    files: list[str] | None
    protocol: Protocol
    batch_size: int | None
    rank: int = 0
    world_size: int = 1


def evaluate_part(part: EvaluationPart) -> PerplexitySums:
    """One rank's sums: load the model here, on whatever device this process has, with its
    torch threads fewer on a loaded machine (:mod:`elmo_core.threads`)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="elmo-evaluate-") as scratch:
        bilm = load_bilm(part.bilm, Path(scratch)).bilm.to(device)
    with fewer_threads_under_load():  # in the driver too, which goes on after
        return evaluate_perplexity(
            bilm,
            part.data,
            part.split,
            files=part.files,
            batch_size=part.batch_size,
            protocol=part.protocol,
            rank=part.rank,
            world_size=part.world_size,
            device=device,
            progress=part.rank == 0,
        )


# --- Ray -----------------------------------------------------------------------------------------


def _num_ray_tasks(workers: int | None) -> int:
    """0 to run in-process; else the number of Ray tasks (given, or one per GPU / node)."""
    if not os.environ.get("RAY_ADDRESS") and (workers is None or workers <= 1):
        return 0
    import ray

    from pipelines.common.ray_cluster import connect_ray

    connect_ray()
    if workers:
        return workers
    gpus = int(ray.cluster_resources().get("GPU", 0))
    return gpus or max(1, sum(1 for node in ray.nodes() if node["Alive"]))


def _evaluate_on_ray(job: EvaluationPart, num_tasks: int) -> PerplexitySums:
    """One Ray task per rank of the reader's partitioning; their sums added."""
    import ray

    has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
    task = ray.remote(evaluate_part).options(num_gpus=1 if has_gpus else 0, num_cpus=1)
    parts = [replace(job, rank=rank, world_size=num_tasks) for rank in range(num_tasks)]
    total = PerplexitySums()
    for sums in ray.get([task.remote(part) for part in parts]):
        total = total + sums
    return total
