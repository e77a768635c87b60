"""The evaluate stage: full-softmax perplexity of a trained biLM on heldout shards.

    elmo evaluate --checkpoint PATH_OR_URI --data DATASET [--split heldout] [--files PATTERN ...]
                  [--protocol batched|original] [--batch-size N] [--workers N]
    python -m pipelines.evaluate ...                          # the same main
    evaluate(checkpoint, data, ...) -> EvaluationResult       # what flows call

``checkpoint`` is our model directory, a training checkpoint (``model/`` inside), a training run's
directory (its latest checkpoint), or an MLflow model URI (``models:/name@alias``, ``runs:/...``).
With ``RAY_ADDRESS`` set or ``workers > 1`` the split is divided over Ray tasks (the reader's
rank/world_size partitioning) and their sums added; otherwise it runs in this process. Forward,
backward and geometric-mean perplexity are printed and logged to MLflow with ``heldout_hash``, a
digest of the shards evaluated, so the registry compares models on the same heldout data.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import mlflow
import torch
import typer

from elmo_core.data.manifest import load_manifest
from elmo_core.data.reader import select_shards
from elmo_core.errors import DataError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import CONFIG_FILE, find_model_dir, load_bilm
from elmo_core.perplexity import PerplexitySums, Protocol, evaluate_perplexity
from pipelines.common.cli_runner import run_command
from pipelines.common.tracking import stage_run
from pipelines.models.bilm_pyfunc import BILM_ARTIFACT

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


@dataclass(frozen=True)
class EvaluationResult:
    """Perplexities of one model on one selection of heldout data."""

    forward_perplexity: float
    backward_perplexity: float
    perplexity: float  # geometric mean of the two directions
    num_tokens: int
    split: str
    files: list[str] | None
    protocol: Protocol
    heldout_hash: str
    run_id: str | None = None  # the MLflow run holding the metrics


def evaluate(
    checkpoint: str,
    data: str,
    *,
    split: str = "heldout",
    files: Sequence[str] | None = None,
    protocol: Protocol = "batched",
    batch_size: int | None = None,
    parent_run_id: str | None = None,
    workers: int | None = None,
) -> EvaluationResult:
    """Perplexity of ``checkpoint`` on ``data``'s ``split``, tracked as an ``evaluate`` run."""
    files = list(files) if files else None
    heldout = heldout_hash(data, split, files)
    params = {
        "checkpoint": checkpoint,
        "data": data,
        "split": split,
        "files": str(files),
        "protocol": protocol,
        "batch_size": str(batch_size),
        "heldout_hash": heldout,
    }
    with stage_run(
        "evaluate", run_name=f"evaluate-{_short_name(checkpoint)}", parent_run_id=parent_run_id
    ) as run:
        mlflow.log_params(params)
        job = EvaluationPart(checkpoint, data, split, files, protocol, batch_size)
        num_tasks = _num_ray_tasks(workers)
        sums = _evaluate_on_ray(job, num_tasks) if num_tasks else evaluate_part(job)
        if not sums.num_tokens:
            raise DataError(f"no {split} tokens were scored (files {files})", path=data)
        mlflow.log_metrics(
            {
                "perplexity_forward": sums.forward_perplexity,
                "perplexity_backward": sums.backward_perplexity,
                "perplexity": sums.perplexity,
                "num_tokens": sums.num_tokens,
            }
        )
    return EvaluationResult(
        sums.forward_perplexity,
        sums.backward_perplexity,
        sums.perplexity,
        sums.num_tokens,
        split,
        files,
        protocol,
        heldout,
        run.info.run_id,
    )


def heldout_hash(data: str, split: str, files: Sequence[str] | None) -> str:
    """sha256 over the selected shards' sha256s, in manifest order."""
    shards = select_shards(load_manifest(data), split, files)
    return hashlib.sha256("\n".join(shard.sha256 for shard in shards).encode()).hexdigest()


@dataclass(frozen=True)
class EvaluationPart:
    """What one rank evaluates: the whole job description, so a Ray task needs nothing else."""

    checkpoint: str
    data: str
    split: str
    files: list[str] | None
    protocol: Protocol
    batch_size: int | None
    rank: int = 0
    world_size: int = 1
    tracking_uri: str | None = None  # for MLflow model URIs resolved inside a Ray task


def evaluate_part(part: EvaluationPart) -> PerplexitySums:
    """One rank's sums: resolve and load the model here, on whatever device this process has."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bilm = load_checkpoint(part.checkpoint, part.tracking_uri).to(device)
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


def load_checkpoint(checkpoint: str, tracking_uri: str | None = None) -> BiLM:
    """The biLM named by a model/checkpoint/run directory or an MLflow model URI."""
    if checkpoint.startswith(MLFLOW_SCHEMES):
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        if re.fullmatch(r"runs:/[^/]+", checkpoint):
            checkpoint += "/"  # a whole run's artifacts (MLflow wants a path after the run id)
        with tempfile.TemporaryDirectory(prefix="elmo-evaluate-") as staging:
            downloaded = mlflow.artifacts.download_artifacts(
                artifact_uri=checkpoint, dst_path=staging
            )
            return load_bilm(_model_dir_inside(Path(downloaded), checkpoint))
    return load_bilm(find_model_dir(Path(checkpoint)))


def _model_dir_inside(root: Path, uri: str) -> Path:
    """The downloaded model directory: the ``bilm`` artifact of a pyfunc model, or any one."""
    found = sorted(config.parent for config in root.rglob(CONFIG_FILE))
    preferred = [d for d in found if d.name == BILM_ARTIFACT] or found
    if not preferred:
        raise WeightsError(f"the MLflow artifacts hold no biLM directory ({CONFIG_FILE})", path=uri)
    return preferred[0]


def _short_name(checkpoint: str) -> str:
    return checkpoint.rstrip("/").rsplit("/", 1)[-1] or checkpoint


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

    from pipelines.common.settings import mlflow_tracking_uri

    has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
    task = ray.remote(evaluate_part).options(num_gpus=1 if has_gpus else 0, num_cpus=1)
    parts = [
        replace(job, rank=rank, world_size=num_tasks, tracking_uri=mlflow_tracking_uri())
        for rank in range(num_tasks)
    ]
    total = PerplexitySums()
    for sums in ray.get([task.remote(part) for part in parts]):
        total = total + sums
    return total


# --- command line --------------------------------------------------------------------------------


def evaluate_command(
    checkpoint: Annotated[str, typer.Option(help="model/checkpoint/run directory or MLflow URI")],
    data: Annotated[str, typer.Option(help="prepared dataset directory or fsspec URL")],
    split: Annotated[str, typer.Option(help="split to evaluate")] = "heldout",
    files: Annotated[list[str] | None, typer.Option(help="only these heldout files")] = None,
    protocol: Annotated[str, typer.Option(help="batched (128×20) | original (256×1)")] = "batched",
    batch_size: Annotated[int | None, typer.Option(help="rows (default by protocol)")] = None,
    workers: Annotated[int | None, typer.Option(help="Ray tasks (default: in-process)")] = None,
) -> None:
    """Heldout perplexity (forward, backward, geometric mean) of a biLM, logged to MLflow."""
    if protocol not in ("batched", "original"):
        raise typer.BadParameter(f"{protocol!r} is not batched or original", param_hint="protocol")
    result = evaluate(
        checkpoint,
        data,
        split=split,
        files=files,
        workers=workers,
        protocol=protocol,  # type: ignore[arg-type]
        batch_size=batch_size,
    )
    typer.echo(
        f"{split} ({result.protocol}, {result.num_tokens:,} tokens): forward perplexity "
        f"{result.forward_perplexity:.3f}, backward {result.backward_perplexity:.3f}, "
        f"geometric mean {result.perplexity:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.evaluate``: the same command as ``elmo evaluate``."""
    return run_command(evaluate_command, argv)
