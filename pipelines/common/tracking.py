"""MLflow tracking shared by every stage: one run per stage, nested under the flow's run.

A stage run started inside a flow is a child of the flow's parent run (passed explicitly or through
``ELMO_MLFLOW_PARENT_RUN_ID``, which survives the hop into a Ray job); a stage run on its own is a
top-level run tagged with what it used. Curves people would rather see than read are logged as
figures next to the metrics.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Run, RunStatus
from pydantic import BaseModel

from pipelines.common.settings import elmo_home, mlflow_tracking_uri

EXPERIMENT = os.environ.get("ELMO_MLFLOW_EXPERIMENT", "elmo")
PARENT_RUN_ENV = "ELMO_MLFLOW_PARENT_RUN_ID"
STAGE_TAG = "elmo.stage"
MAX_PARAM_CHARS = 6000
SYSTEM_METRICS_INTERVAL_ENV = "ELMO_SYSTEM_METRICS_INTERVAL_S"
DEFAULT_SYSTEM_METRICS_S = 2.0
DATASET_DIGEST_CHARS = 36  # the longest digest MLflow's stores keep
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves the embedded store
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's description


def ui_url(experiment_id: str, run_id: str | None = None, server: str | None = None) -> str:
    """A link into the MLflow UI that opens its model-training view: MLflow 3's UI opens the
    GenAI view (traces, no runs in sight) unless the link carries ``workflowType``. ``server``
    defaults to the tracking server, or ``mlflow ui``'s address for the embedded store."""
    if server is None:
        uri = mlflow_tracking_uri()
        server = uri if uri.startswith(("http://", "https://")) else LOCAL_UI
    route = f"/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{server.rstrip('/')}/#{route}?workflowType=machine_learning"


def use_tracking() -> str:
    """Point this process's MLflow client at the project's store; returns the URI."""
    uri = mlflow_tracking_uri()
    mlflow.set_tracking_uri(uri)
    return uri


@contextmanager
def stage_run(
    stage: str,
    *,
    run_name: str,
    run_id: str | None = None,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    system_metrics: bool = True,
) -> Iterator[mlflow.ActiveRun]:
    """Start (or resume, given ``run_id``) the MLflow run of one stage; it ends as what happened.

    FINISHED when the block completes, KILLED when it is interrupted (Ctrl-C, SIGTERM: see
    :mod:`pipelines.common.cli_runner`), FAILED on any other exception; MLflow's own context
    manager would call an interrupted run FAILED. The parent comes from ``parent_run_id`` or
    ``ELMO_MLFLOW_PARENT_RUN_ID``; the run is tagged with its stage name so the flow's summary can
    find its children. ``system_metrics``: this process's CPU, memory, disk and network (GPU with
    pynvml) beside the run's metrics; off where the work runs in other processes that log them.
    """
    use_tracking()
    ensure_experiment()
    sample_system_metrics()
    if run_id is not None:
        run = mlflow.start_run(run_id=run_id, log_system_metrics=system_metrics)
    else:
        parent = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
        all_tags = {STAGE_TAG: stage, **(tags or {})}
        run = mlflow.start_run(
            run_name=run_name,
            parent_run_id=parent,
            tags=all_tags,
            log_system_metrics=system_metrics,
        )
    try:
        yield run
    except BaseException as error:
        mlflow.end_run(ended_status(error))
        raise
    mlflow.end_run(ended_status(None))


def sample_system_metrics() -> None:
    """Sample system metrics every ``ELMO_SYSTEM_METRICS_INTERVAL_S`` seconds (default 2): at
    MLflow's 10 s a stage of a minute or two shows a point or two, not a curve."""
    interval = float(os.environ.get(SYSTEM_METRICS_INTERVAL_ENV, DEFAULT_SYSTEM_METRICS_S))
    mlflow.set_system_metrics_sampling_interval(interval)
    mlflow.set_system_metrics_samples_before_logging(1)


def ended_status(error: BaseException | None) -> str:
    """How a run ends: FINISHED without ``error``, KILLED when interrupted, else FAILED."""
    if error is None:
        return RunStatus.to_string(RunStatus.FINISHED)
    if isinstance(error, KeyboardInterrupt):
        return RunStatus.to_string(RunStatus.KILLED)
    return RunStatus.to_string(RunStatus.FAILED)


@contextmanager
def shared_run(run_id: str) -> Iterator[mlflow.ActiveRun]:
    """Log into a run that another process owns (a training worker into the driver's run),
    leaving it RUNNING: the owner's :func:`stage_run` decides how it ends. The system metrics
    are this process's (a training worker's node: where the work runs)."""
    use_tracking()
    sample_system_metrics()
    run = mlflow.start_run(run_id=run_id, log_system_metrics=True)
    try:
        yield run
    finally:
        mlflow.end_run(RunStatus.to_string(RunStatus.RUNNING))


def ensure_experiment() -> None:
    """Select the experiment, creating it with its artifacts under ``ELMO_HOME`` when the store is
    the embedded SQLite file (MLflow's default would be ``./mlruns`` of whatever directory a
    command happens to run in)."""
    if mlflow.get_experiment_by_name(EXPERIMENT) is None and mlflow_tracking_uri().startswith(
        "sqlite:"
    ):
        with contextlib.suppress(mlflow.exceptions.MlflowException):  # created meanwhile
            mlflow.create_experiment(
                EXPERIMENT, artifact_location=(elmo_home() / "artifacts").as_uri()
            )
    mlflow.set_experiment(EXPERIMENT)


def find_run(run_name: str, stage: str) -> Run | None:
    """The newest run of ``stage`` called ``run_name`` (how a re-run finds the run it resumes)."""
    use_tracking()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return None
    runs = mlflow.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{STAGE_TAG}` = '{stage}' and attributes.run_name = '{run_name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return runs[0] if runs else None


def log_dataset(dataset_url: str, context: str) -> None:
    """Record the prepared dataset as the active run's input (MLflow's Datasets panel): named
    by its directory, its digest the manifest's sha256 (which names every shard by checksum, so
    two runs on the same data show the same digest), its source the URL it was read from;
    ``context`` says how the run used it (``training``, ``evaluation``)."""
    from elmo_core.data.manifest import manifest_sha256

    name = dataset_url.rstrip("/").rsplit("/", 1)[-1]
    log_input_file(dataset_url, name, manifest_sha256(dataset_url), context)


def log_input_file(location: str, name: str, sha256: str, context: str) -> None:
    """Record data at ``location`` (a path or URL) as the active run's input, its digest the
    content's ``sha256`` (cut to what MLflow keeps)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the same
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(location)
    digest = sha256[:DATASET_DIGEST_CHARS]
    dataset = MetaDataset(source, name=name, digest=digest)  # type: ignore[abstract]  # complete at run time
    mlflow.log_input(dataset, context=context)


def flatten_params(config: BaseModel | Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted ``section.key`` → string value as MLflow params (long values cut, not refused)."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{dotted}."))
        else:
            flat[dotted] = str(value)[:MAX_PARAM_CHARS]
    return flat


def log_config(config: BaseModel, artifact_file: str = "config.json") -> None:
    """Log a resolved config as params (searchable) and as one JSON artifact (exact)."""
    mlflow.log_params(flatten_params(config))
    mlflow.log_dict(config.model_dump(mode="json"), artifact_file)


def log_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]],
    artifact_file: str,
    *,
    title: str,
    ylabel: str,
    log_y: bool = False,
) -> None:
    """Plot named ``(step, value)`` curves on one axis and log the figure as ``artifact_file``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(steps, values, label=name, marker="." if len(points) < 50 else None)
    axis.set(title=title, xlabel="step", ylabel=ylabel)
    if log_y:
        axis.set_yscale("log")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    mlflow.log_figure(figure, artifact_file)
    plt.close(figure)


def git_commit(repo: Path | None = None) -> str | None:
    """The commit of the code that ran, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo or Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
