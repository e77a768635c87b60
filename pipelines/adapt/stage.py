"""The adapt stage: a frozen biLM + a learned scalar mix + a task head, one Ray task per task.

The biLM's activations come from the activation cache, computed once for every epoch and later
job. The baseline is the same head on task-trained word embeddings, not the paper's GloVe (none
offline). A finished run of the same biLM weights, task (config and data) and seeds is reused
with the model it registered: re-running a flow redoes no adaptation.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import mlflow
import torch
from pydantic import BaseModel, ConfigDict, Field

import elmo_core
import pipelines.adapt
import pipelines.common
from elmo_core.errors import ConfigError
from elmo_core.tasks.activation_cache import bilm_fingerprint
from elmo_core.tasks.readers import AnyDataset
from elmo_core.tasks.seeds import DEFAULT_SEEDS, Scores
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import BASELINE, TaskResult, TaskSplit, main_metric, train_task
from elmo_core.tasks.types import task_type
from pipelines.adapt.error_analysis import evaluation_split, log_error_analysis, predict_split
from pipelines.adapt.figures import mix_figure
from pipelines.adapt.task_records import (
    Headline,
    SeedRun,
    TaskModelVersion,
    epoch_logger,
    gains,
    headline_score,
    log_outcome,
    log_task_data,
    log_task_model,
    task_params,
)
from pipelines.common.code_version import code_version, source_files
from pipelines.common.settings import elmo_home, mlflow_tracking_uri
from pipelines.common.task_data import cache_splits, check_tasks, read_splits, task_inputs
from pipelines.registry.tags import TASK_TAG
from pipelines.serving.bilm_loader import (
    BiLMReference,
    LoadedBiLM,
    load_bilm,
    resolve_bilm,
)
from pipelines.tracking.figures import log_curves, log_figure, metric_label
from pipelines.tracking.stage_runs import (
    CONFIG_ARTIFACT,
    DESCRIPTION_TAG,
    EXPERIMENT,
    PARENT_RUN_ENV,
    REUSE_KEY_TAG,
    ensure_experiment,
    find_finished,
    location_link,
    model_link,
    report_progress,
    reuse_key,
    source_tags,
    stage_run,
    use_tracking,
)
from pipelines.tracking.train_progress import duration

BASELINE_TAG = "elmo.baseline"
MIX_FIGURE = "scalar_mix.png"
DEV_CURVE_FIGURE = "dev_curve.png"
RESULT_FILE = "adapt_result.json"  # the run's AdaptResult, which a re-run of the same job reuses


class AdaptResources(BaseModel):
    """What each adaptation job asks Ray for; ``gpus_per_task`` None: 1 if the cluster has GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus_per_task: float = Field(1.0, gt=0)
    gpus_per_task: float | None = Field(None, ge=0)


@dataclass(frozen=True)
class AdaptJob:
    """Everything one Ray task needs: it reads no state of the driver."""

    task: TaskConfig
    bilm: BiLMReference
    cache_dir: str
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AdaptResult:
    """Scores with and without ELMo, the gain, the learned mix and the registered model (the
    first seed's); ``elmo_scores`` and ``baseline_scores``: the main metric on test (dev without
    a test split) for every seed."""

    task: str
    run_id: str
    model_name: str  # elmo-<task>
    model_version: int
    model_uri: str  # models:/elmo-<task>/<version>
    metric: str  # "f1" or "accuracy": the main score
    elmo_dev: dict[str, float]
    elmo_test: dict[str, float]
    baseline_dev: dict[str, float]
    baseline_test: dict[str, float]
    gain: dict[str, float]  # "dev_<metric>" / "test_<metric>": ELMo − baseline
    mix_weights: list[float]
    gamma: float
    seeds: list[int] = field(default_factory=list)
    elmo_scores: list[float] = field(default_factory=list)
    baseline_scores: list[float] = field(default_factory=list)
    baseline: str = BASELINE  # which baseline ran
    examples: int = 0  # the size of the split the scores are on (test, else dev)
    reused: bool = False  # True when a finished run of the same job gave it

    @property
    def split(self) -> str:
        """The split the scores are on: test, else dev."""
        return "test" if self.elmo_test else "dev"


def adapt(
    tasks: Sequence[TaskConfig],
    bilm: str,
    *,
    bilm_options: str | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    resources: AdaptResources | None = None,
) -> list[AdaptResult]:
    """Adapt ``bilm`` to every task, the tasks in parallel as Ray tasks; results in task order.
    Each task trains ELMo and the baseline once per seed."""
    check_tasks(tasks)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(
            f"seeds must be distinct and at least one, not {list(seeds)}", key="seeds"
        )
    # A bad source fails before any job starts; an alias is pinned, so every job loads one version.
    reference = resolve_bilm(bilm, bilm_options, options_key="bilm_options")
    use_tracking()
    ensure_experiment()  # create the store once, before jobs write to it at once
    cache_dir = str(elmo_home() / "cache" / "activations")
    parent = parent_run_id or os.environ.get(PARENT_RUN_ENV) or None
    # a run made in a Ray worker: MLflow would name Ray's default_worker.py; the driver's commit
    run_tags = source_tags("pipelines.adapt", job=parent is not None) | dict(tags or {})
    jobs = [AdaptJob(task, reference, cache_dir, tuple(seeds), parent, run_tags) for task in tasks]
    return _run_on_ray(jobs, resources or AdaptResources())


def run_adapt_job(job: AdaptJob) -> AdaptResult:
    """One task: cached activations, ELMo and baseline training, MLflow run, registered model;
    or the result of a finished run of the same job (:func:`job_key`)."""
    task = job.task
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="elmo-adapt-") as scratch:
        source = load_bilm(job.bilm, Path(scratch) / "bilm-source")
        key = job_key(job, source.bilm)
        finished = _finished(key)
        if finished is not None:
            return finished
        datasets = read_splits(task)
        started = time.perf_counter()
        splits = cache_splits(source.bilm.to(device), datasets, job.cache_dir)
        seconds = {"cache": time.perf_counter() - started}
        run_tags = {**job.bilm.tags, TASK_TAG: task.name, BASELINE_TAG: BASELINE, **job.tags}
        with stage_run(
            "adapt", run_name=f"adapt-{task.name}", parent_run_id=job.parent_run_id, tags=run_tags
        ) as run:
            mlflow.log_params(task_params(task) | {"bilm": job.bilm.location, "device": device})
            mlflow.log_dict(task.model_dump(mode="json"), CONFIG_ARTIFACT)
            log_task_data(task)
            mlflow.log_param("seeds", ",".join(map(str, job.seeds)))
            first = job.seeds[0]  # its models are registered and their curves logged
            trainings = _Trainings(2 * len(job.seeds))
            runs = [
                SeedRun(
                    seed,
                    *(
                        _train(
                            task,
                            splits,
                            use_elmo,
                            seed,
                            device,
                            seconds,
                            curves=seed == first,
                            which=f"seed {seed} ({index} of {len(job.seeds)})",
                            trainings=trainings,
                        )
                        for use_elmo in (True, False)
                    ),
                )
                for index, seed in enumerate(job.seeds, 1)
            ]
            example = task_type(task.type).text_columns(datasets["train"].examples[0])
            sizes = {split: len(dataset.examples) for split, dataset in datasets.items()}
            model = log_task_model(runs, sizes, source, job.bilm, Path(scratch), example)
            log_outcome(runs, seconds, model.model_id)
            _log_analysis(task, runs[0], source, datasets)
            result = _result(run.info.run_id, model, runs, sizes)
            mlflow.log_dict(dataclasses.asdict(result), RESULT_FILE)
            mlflow.set_tag(DESCRIPTION_TAG, _description(job, result))
            mlflow.set_tag(REUSE_KEY_TAG, key)  # last: only a complete run is ever reused
    return result


def _description(job: AdaptJob, result: AdaptResult) -> str:
    """What the run did, then its result in the registered version's own words: a task model's
    Source Run leads here."""
    seeds = ", ".join(map(str, job.seeds))
    did = (
        f"Adapted the frozen biLM {location_link(job.bilm.location, relative=True)} to "
        f"{job.task.name} ({job.task.type}): "
        f"the task head trained with ELMo and without it (the baseline) over seeds {seeds}."
    )
    return f"{did}\n\n{result_line(result, partial(model_link, relative=True))}"


def job_key(job: AdaptJob, bilm: torch.nn.Module) -> str:
    """What a job's result depends on: the biLM's weights (wherever they were loaded from), the
    task's config and data, the seeds and the code that adapts."""
    code = source_files(elmo_core, pipelines.adapt, pipelines.common)
    return reuse_key(
        {
            "bilm": bilm_fingerprint(bilm),
            "task": task_inputs(job.task),
            "seeds": list(job.seeds),
            "code": code_version(code),
        }
    )


def _finished(key: str) -> AdaptResult | None:
    """The result of the newest finished run of ``key``, unless the model version it registered
    has been deleted since (then the job runs again and registers a new one)."""
    run = find_finished("adapt", key)
    if run is None:
        return None
    stored = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/{RESULT_FILE}")
    result = AdaptResult(**stored)
    try:
        mlflow.MlflowClient().get_model_version(result.model_name, str(result.model_version))
    except mlflow.exceptions.MlflowException:
        return None
    return dataclasses.replace(result, reused=True)


def _train(
    task: TaskConfig,
    splits: Mapping[str, TaskSplit],
    use_elmo: bool,
    seed: int,
    device: str,
    seconds: dict[str, float],
    *,
    curves: bool,
    which: str,
    trainings: _Trainings,
) -> TaskResult:
    """Train one of the two models with ``seed``, logging its curves when ``curves`` (the first
    seed's: the model registered) and each epoch as the run's progress (``which`` seed of the
    run's it is); its time is added to ``seconds``."""
    prefix = "elmo" if use_elmo else "baseline"
    metric = main_metric(task)
    log_curve = epoch_logger(prefix, metric, seed) if curves else None
    model = "with ELMo" if use_elmo else "the baseline"

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        if log_curve is not None:
            log_curve(epoch, metrics)
        dev = f", dev {metric} {metrics[f'dev_{metric}']:.4f}" if f"dev_{metric}" in metrics else ""
        at_most = f"epoch {epoch} of at most {task.training.epochs}"  # early stopping may end it
        share = trainings.share(epoch, task.training.epochs)
        report_progress(f"{which}, {model}: {at_most}{dev}, ETA {trainings.eta(share)}", share)

    started = time.perf_counter()
    result = train_task(
        task,
        splits["train"],
        splits.get("dev"),
        splits.get("test"),
        use_elmo,
        epoch_callback=on_epoch,
        device=device,
        seed=seed,
    )
    seconds[prefix] = seconds.get(prefix, 0.0) + time.perf_counter() - started
    trainings.done += 1
    return result


@dataclass
class _Trainings:
    """How far a run's trainings (ELMo's and the baseline's, per seed) are: its ETA."""

    total: int
    started: float = field(default_factory=time.perf_counter)
    done: int = 0

    def share(self, epoch: int, epochs: int) -> float:
        """The share done, the current training counted as ``epoch`` of its at most ``epochs``:
        early stopping ends most sooner, so it errs low."""
        return (self.done + epoch / epochs) / self.total

    def eta(self, share: float) -> str:
        """The time left at the rate so far, ``share`` of the work done."""
        return duration((time.perf_counter() - self.started) * (1 - share) / share)


def _log_analysis(
    task: TaskConfig,
    registered: SeedRun,
    source: LoadedBiLM,
    datasets: Mapping[str, AnyDataset],
) -> None:
    """The figures (mix, dev curves) and the error analysis of the evaluation split, each of the
    registered seed's models."""
    elmo, baseline = registered.elmo, registered.baseline
    log_figure(mix_figure(elmo, registered.seed), MIX_FIGURE)
    metric = main_metric(task)
    if "dev" in datasets:
        curves = {
            label: [(int(epoch["epoch"]), epoch[f"dev_{metric}"]) for epoch in result.history]
            for label, result in (("ELMo", elmo), ("baseline", baseline))
        }
        score = metric_label(f"dev_{metric}")
        title = f"{task.name}: {score} by epoch, ELMo vs baseline (seed {registered.seed})"
        log_curves(curves, DEV_CURVE_FIGURE, title=title, ylabel=score, xlabel="epoch")
    split = evaluation_split(datasets)
    if split is not None:
        found = predict_split(elmo.model, datasets[split], split, source.bilm)
        log_error_analysis(task, elmo.model.labels, found)


def _result(
    run_id: str, model: TaskModelVersion, runs: Sequence[SeedRun], sizes: Mapping[str, int]
) -> AdaptResult:
    elmo, baseline = runs[0].elmo, runs[0].baseline
    headline = Headline.of(runs, sizes)
    return AdaptResult(
        task=elmo.task,
        run_id=run_id,
        model_name=model.name,
        model_version=model.version,
        model_uri=f"models:/{model.name}/{model.version}",
        metric=main_metric(elmo.model.task),
        elmo_dev=elmo.dev_metrics,
        elmo_test=elmo.test_metrics,
        baseline_dev=baseline.dev_metrics,
        baseline_test=baseline.test_metrics,
        gain=gains(elmo, baseline),
        mix_weights=list(elmo.mix_weights or []),
        gamma=float(elmo.gamma if elmo.gamma is not None else 1.0),
        seeds=[run.seed for run in runs],
        elmo_scores=[headline_score(run.elmo) for run in runs],
        baseline_scores=[headline_score(run.baseline) for run in runs],
        examples=headline.examples if headline is not None else 0,
    )


# --- Ray -----------------------------------------------------------------------------------------


def _run_on_ray(jobs: Sequence[AdaptJob], resources: AdaptResources) -> list[AdaptResult]:
    """One Ray task per job; a user error inside a job is re-raised here as itself."""
    import ray

    from pipelines.common.ray_cluster import connect_ray, ray_get

    connect_ray()
    gpus = resources.gpus_per_task
    if gpus is None:
        gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    # Workers may have started before this process chose its ELMO_HOME or tracking store.
    env = {"ELMO_HOME": str(elmo_home()), "MLFLOW_TRACKING_URI": mlflow_tracking_uri()}
    env |= {"ELMO_MLFLOW_EXPERIMENT": EXPERIMENT}
    remote = ray.remote(run_adapt_job).options(
        num_cpus=resources.cpus_per_task, num_gpus=gpus, runtime_env={"env_vars": env}
    )
    return list(ray_get([remote.remote(job) for job in jobs]))


def result_line(result: AdaptResult, show_model: Callable[[str], str] = str) -> str:
    """``task ner: test f1 0.9120 ± 0.0100 with ELMo, 0.8800 ± 0.0200 without (mean ± sample
    standard deviation over seeds 0, 1, 2; 300 test examples): gain +0.0320, beyond the gain's
    standard deviation (0.0224). This version holds seed 0's weights (test f1 0.9150) →
    models:/elmo-ner/3``, in the registered version's own words; ``task ner reused (already
    adapted): ...`` when a finished run gave it. ``show_model`` writes the model's URI (a
    markdown link to it, in a summary)."""
    headline = Headline(
        "test" if result.elmo_test else "dev",
        result.metric,
        Scores(tuple(result.elmo_scores)),
        Scores(tuple(result.baseline_scores)),
        tuple(result.seeds),
        result.examples,
    )
    reused = " reused (already adapted)" if result.reused else ""
    return f"task {result.task}{reused}: {headline} → {show_model(result.model_uri)}"
