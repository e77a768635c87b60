"""MLflow tracking shared by every stage: one run per stage, nested under the flow's run.

The parent's id comes as an argument or through ``ELMO_MLFLOW_PARENT_RUN_ID``, which survives the
hop into a Ray job; a stage run on its own is a top-level run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import mlflow
import psutil
from mlflow.entities import Run, RunStatus
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.utils.mlflow_tags import (
    MLFLOW_GIT_COMMIT,
    MLFLOW_SOURCE_NAME,
    MLFLOW_SOURCE_TYPE,
)
from pydantic import BaseModel

from pipelines.common.settings import elmo_home, mlflow_tracking_uri

EXPERIMENT = os.environ.get("ELMO_MLFLOW_EXPERIMENT", "elmo")
PARENT_RUN_ENV = "ELMO_MLFLOW_PARENT_RUN_ID"
STAGE_TAG = "elmo.stage"
MAX_PARAM_CHARS = 6000
SYSTEM_METRICS_INTERVAL_ENV = "ELMO_SYSTEM_METRICS_INTERVAL_S"
DEFAULT_SYSTEM_METRICS_S = 1.0  # at first; wider apart as a run ages, up to LATE_SYSTEM_METRICS_S
LATE_SYSTEM_METRICS_S = 10.0  # MLflow's own interval: what an hours-long run is sampled at
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves the embedded store by default
MLFLOW_UI_ENV = "ELMO_MLFLOW_UI_URL"  # where the user serves it, if elsewhere
# What keeps a link in MLflow 3's model-training view: without it the UI opens its GenAI view.
TRAINING_VIEW = "?workflowType=machine_learning"
DESCRIPTION_TAG = "mlflow.note.content"  # the run's (and the experiment's) description
PROGRESS_TAG = "elmo.progress"  # a stage run's latest step of work (adapt, analyze)
PROGRESS_SHARE_TAG = "elmo.progress_share"  # how much of its work that is done, 0 to 1
REUSE_KEY_TAG = "elmo.reuse_key"  # what a finished adapt or analyze run was made from
CONFIG_ARTIFACT = "config.json"  # a stage run's resolved config, whole
EXPERIMENT_DESCRIPTION = (
    "ELMo pretraining and adaptation. Each flow run is a parent run; its stages (prepare, train, "
    "evaluate, register, adapt and, when asked, analyze; embed in the embed flow) are its child "
    "runs, named `<stage>-<subject>`. The biLM's training curves are the `bilm/train` and "
    "`bilm/validation` chart sections; the task models' are `task/seed_<s>` (the first seed's "
    "curves), then `task/summary` (the final scores, means over the seeds; each seed's own "
    "score is a row of the run's `seed_scores.json` table)."
)

log = logging.getLogger(__name__)


def ui_server() -> str:
    """The MLflow UI's address: the tracking server's, else where ``mlflow ui`` serves the
    embedded store (``ELMO_MLFLOW_UI_URL``, by default ``mlflow ui``'s own 127.0.0.1:5000)."""
    uri = mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        return uri
    return os.environ.get(MLFLOW_UI_ENV, LOCAL_UI)


def ui_url(
    experiment_id: str,
    run_id: str | None = None,
    server: str | None = None,
    *,
    relative: bool = False,
) -> str:
    """A link into the MLflow UI that opens its model-training view: MLflow 3's UI opens the
    GenAI view (traces, no runs in sight) unless the link carries ``workflowType``. ``server``
    defaults to :func:`ui_server`; ``relative``: ``#/experiments/…`` alone, for text shown inside
    the UI (a description), which then works on whatever address serves it."""
    route = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    link = f"{route}{TRAINING_VIEW}"
    return link if relative else f"{(server or ui_server()).rstrip('/')}/{link}"


def model_link(uri: str, *, relative: bool = False) -> str:
    """``[models:/elmo-ner/3](…/#/models/elmo-ner/versions/3?workflowType=…)``: a registered
    model's URI as a markdown link to its version's page (its model's, for an alias) in the
    model-training view, relative as :func:`ui_url`'s."""
    name, _, version = uri.removeprefix("models:/").partition("/")
    route = f"#/models/{quote(name.partition('@')[0])}"
    if version:
        route += f"/versions/{version}"
    route += TRAINING_VIEW
    link = route if relative else f"{ui_server().rstrip('/')}/{route}"
    return f"[{uri}]({link})"


def location_link(location: str, *, relative: bool = False) -> str:
    """A biLM's location as markdown: a registered model's URI as :func:`model_link`, anything
    else (a directory, a file) as code."""
    if location.startswith("models:/"):
        return model_link(location, relative=relative)
    return f"`{location}`"


def run_link(run_id: str) -> str:
    """``[<run name>](#/experiments/…)``: a run as a description in the MLflow UI names it."""
    run = mlflow.MlflowClient(use_tracking()).get_run(run_id)
    return f"[{run.info.run_name}]({ui_url(run.info.experiment_id, run_id, relative=True)})"


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
) -> Iterator[mlflow.ActiveRun]:
    """Start (or resume, given ``run_id``) the MLflow run of one stage; it ends as what happened.

    FINISHED when the block completes, KILLED when it is interrupted (Ctrl-C, SIGTERM: see
    :mod:`pipelines.common.cli_runner`), FAILED on any other exception; MLflow's own context
    manager would call an interrupted run FAILED. The parent comes from ``parent_run_id`` or
    ``ELMO_MLFLOW_PARENT_RUN_ID``; the run is tagged with its stage name so the flow's summary can
    find its children, and its source is the stage's module however it was started (the CLI, a
    flow, a Ray job or worker), so MLflow's Source column names one thing per stage. This
    process's system metrics are sampled for as long as the block runs.
    """
    use_tracking()
    ensure_experiment()
    if run_id is not None:
        run = mlflow.start_run(run_id=run_id, log_system_metrics=False)
    else:
        parent = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
        source = source_tags(f"pipelines.{stage}", job=parent is not None)
        all_tags = {**source, STAGE_TAG: stage, **(tags or {})}
        run = mlflow.start_run(
            run_name=run_name, parent_run_id=parent, tags=all_tags, log_system_metrics=False
        )
    try:
        with system_metrics(run.info.run_id):
            yield run
    except BaseException as error:
        _end(run.info.run_id, ended_status(error))
        raise
    _end(run.info.run_id, ended_status(None))


_ETA = re.compile(r",? ETA [^,;]*$")  # how report_progress's lines end while work remains


def _end(run_id: str, status: str) -> None:
    """End the run as ``status``, its last progress line (where it reported one) saying so: a
    finished run that still read "epoch 14 of at most 30" would look stopped mid-way. The line
    itself stays, but for its ETA, which an ended run no longer has: a flow that looks at it only
    now still logs where the work got to."""
    try:
        progress = mlflow.MlflowClient().get_run(run_id).data.tags.get(PROGRESS_TAG)
        if progress is not None:
            where = _ETA.sub("", progress)
            ended = {PROGRESS_TAG: f"{where}; {status.lower()}"}
            if status == "FINISHED":
                ended[PROGRESS_SHARE_TAG] = "1"
            mlflow.set_tags(ended)
    except Exception as err:  # a busy tracking server must not hide how the run ended
        log.warning("run %s: its progress line could not be finalised: %s", run_id, err)
    mlflow.end_run(status)


def report_progress(line: str, share: float) -> None:
    """Say where the active stage run's work is (its ``PROGRESS_TAG``) and how much of it is done
    (``share``, 0 to 1): a flow's log and progress bar follow the runs of its stages that run out
    of its sight (Ray tasks) this way."""
    mlflow.set_tags({PROGRESS_TAG: line, PROGRESS_SHARE_TAG: f"{min(max(share, 0.0), 1.0):.4f}"})


def stage_run_name(stage: str, subject: str) -> str:
    """``<stage>-<subject>``: every stage run is named by its verb and what it worked on."""
    return f"{stage}-{subject}"


def location_name(location: str) -> str:
    """What a run working on ``location`` is named after, with no ``/`` (MLflow's table and a
    path both read one as a folder): a registered model's ``elmo-bilm-v3`` or
    ``elmo-bilm@champion``, a run URI's ``<run id>-<path>``, else the last part of the path, or
    the part before it for a ``model`` directory (a training run's ``bilm-<hash>/model`` is
    ``bilm-<hash>``)."""
    from elmo_core.model.serialization import MODEL_DIR

    if location.startswith("models:/"):  # elmo-bilm/3 → elmo-bilm-v3; an alias stays
        name, _, version = location.removeprefix("models:/").strip("/").partition("/")
        return f"{name}-v{version}" if version else name
    if location.startswith("runs:/"):
        return location.removeprefix("runs:/").strip("/").replace("/", "-")
    parts = [part for part in location.rstrip("/").split("/") if part]
    if len(parts) > 1 and parts[-1] == MODEL_DIR:
        return parts[-2]
    return parts[-1] if parts else location


@contextmanager
def system_metrics(run_id: str, node: str | None = None) -> Iterator[None]:
    """Sample this process's system metrics into ``run_id`` while the block runs (under
    ``system/<node>/`` when ``node`` names the machine: one of several logging into one run)."""
    interval = float(os.environ.get(SYSTEM_METRICS_INTERVAL_ENV, DEFAULT_SYSTEM_METRICS_S))
    sampler = SystemMetricsSampler(
        run_id, sampling_interval=interval, resume_logging=True, node_id=node
    )
    sampler.start()
    try:
        yield
    finally:
        sampler.finish()


class SystemMetricsSampler(SystemMetricsMonitor):
    """MLflow's system metrics monitor, sampled so that a stage of seconds shows a curve.

    Every ``sampling_interval`` seconds at first, wider apart as the run ages (an interval of a
    thirtieth of its age, up to MLflow's 10 s), and once more as the run ends. MLflow's own loop
    logs nothing for a run shorter than one interval, drops the last interval, logs psutil's
    first CPU reading (a meaningless 0) and stops for good when one look at the run fails (a
    busy SQLite store); here a failed write is retried with the next sample.
    """

    def monitor(self) -> None:
        psutil.cpu_percent()  # the baseline of the first reading
        started = time.monotonic()
        while not self._shutdown_event.wait(self._interval(time.monotonic() - started)):
            self._sample()
        self._sample()  # the last, partial interval

    def _interval(self, age: float) -> float:
        return max(float(self.sampling_interval), min(LATE_SYSTEM_METRICS_S, age / 30))

    def _sample(self) -> None:
        try:
            self.collect_metrics()
            self.publish_metrics(self.aggregate_metrics())
        except Exception as error:  # the store may be busy: the next sample goes on
            log.debug("system metrics sample not logged: %s", error)


def ended_status(error: BaseException | None) -> str:
    """How a run ends: FINISHED without ``error``, KILLED when interrupted, else FAILED."""
    if error is None:
        return RunStatus.to_string(RunStatus.FINISHED)
    if isinstance(error, KeyboardInterrupt):
        return RunStatus.to_string(RunStatus.KILLED)
    return RunStatus.to_string(RunStatus.FAILED)


@contextmanager
def shared_run(run_id: str, node: str | None = None) -> Iterator[mlflow.ActiveRun]:
    """Log into a run that another process owns (a training worker into the driver's run),
    leaving it RUNNING: the owner's :func:`stage_run` decides how it ends. The owner samples its
    own machine's system metrics; ``node`` names this one where it is another machine, whose
    metrics are logged under ``system/<node>/``."""
    use_tracking()
    run = mlflow.start_run(run_id=run_id, log_system_metrics=False)
    try:
        with system_metrics(run_id, node) if node else contextlib.nullcontext():
            yield run
    finally:
        mlflow.end_run(RunStatus.to_string(RunStatus.RUNNING))


def ensure_experiment() -> None:
    """Select the experiment, creating it with its description (and, when the store is the
    embedded SQLite file, its artifacts under ``ELMO_HOME``: MLflow's default would be
    ``./mlruns`` of whatever directory a command happens to run in)."""
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        local = mlflow_tracking_uri().startswith("sqlite:")
        with contextlib.suppress(mlflow.exceptions.MlflowException):  # created meanwhile
            mlflow.create_experiment(
                EXPERIMENT,
                artifact_location=(elmo_home() / "artifacts").as_uri() if local else None,
                tags={DESCRIPTION_TAG: EXPERIMENT_DESCRIPTION},
            )
    elif DESCRIPTION_TAG not in experiment.tags:  # created before it had one
        mlflow.MlflowClient().set_experiment_tag(
            experiment.experiment_id, DESCRIPTION_TAG, EXPERIMENT_DESCRIPTION
        )
    mlflow.set_experiment(EXPERIMENT)


def find_run(run_name: str, stage: str) -> Run | None:
    """The newest run of ``stage`` called ``run_name`` (how a re-run finds the run it resumes)."""
    return _newest_run(stage, f"attributes.run_name = '{run_name}'")


def reuse_key(inputs: Mapping[str, Any]) -> str:
    """sha256 of ``inputs`` (JSON): everything a stage run's result depends on, its code's
    version included, so that a re-run with the same inputs finds it (:func:`find_finished`)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def find_finished(stage: str, key: str) -> Run | None:
    """The newest FINISHED run of ``stage`` tagged with ``key``, which a stage sets once the
    run's result is stored: what a re-run of the same work reuses instead of redoing it."""
    return _newest_run(
        stage, f"tags.`{REUSE_KEY_TAG}` = '{key}' and attributes.status = 'FINISHED'"
    )


def _newest_run(stage: str, condition: str) -> Run | None:
    """The newest run of ``stage`` in the experiment that also meets ``condition`` (a filter)."""
    use_tracking()
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        return None
    runs = mlflow.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{STAGE_TAG}` = '{stage}' and {condition}",
        order_by=["attributes.start_time DESC"],
        max_results=1,
        output_format="list",
    )
    return runs[0] if runs else None


def flatten_params(
    config: BaseModel | Mapping[str, Any], prefix: str = "", *, whole_in: str | None = None
) -> dict[str, str]:
    """Dotted ``section.key`` → string value as MLflow params; a key whose value is None is left
    out, not logged as the string "None". A value past MLflow's limit is cut, not refused, and
    ends saying so and where the whole value is (``whole_in``: an artifact, a flow run)."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
    flat: dict[str, str] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{dotted}.", whole_in=whole_in))
        elif value is not None:
            flat[dotted] = _within_limit(str(value), whole_in)
    return flat


def _within_limit(value: str, whole_in: str | None) -> str:
    if len(value) <= MAX_PARAM_CHARS:
        return value
    where = f"; whole in {whole_in}" if whole_in else ""
    note = f" … [cut from {len(value):,} characters{where}]"
    return value[: MAX_PARAM_CHARS - len(note)] + note


def log_config(config: BaseModel, artifact_file: str = CONFIG_ARTIFACT) -> None:
    """Log a resolved config as params (searchable) and as one JSON artifact (exact)."""
    mlflow.log_params(flatten_params(config, whole_in=artifact_file))
    mlflow.log_dict(config.model_dump(mode="json"), artifact_file)


def source_tags(source_name: str, *, job: bool) -> dict[str, str]:
    """MLflow's user and source tags for a run or model that MLflow would name wrongly or not at
    all (one created in a Ray worker would name Ray's ``default_worker.py``, one created with the
    client nothing): ``source_name``, ``JOB`` inside a flow else ``LOCAL``, and the commit of
    this checkout when it is one."""
    from mlflow.tracking.context.registry import resolve_tags

    tags = {MLFLOW_SOURCE_NAME: source_name, MLFLOW_SOURCE_TYPE: "JOB" if job else "LOCAL"}
    commit = git_commit()
    if commit is not None:
        tags[MLFLOW_GIT_COMMIT] = commit
    return dict(resolve_tags(tags))


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
