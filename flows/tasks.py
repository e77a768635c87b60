"""Prefect tasks over the pipeline stages: each a thin call with paths in and paths out.

Only transient failures (a corpus download) are retried: a user's error fails the same way twice,
and training recovers on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import prefect.runtime.task_run
from prefect import Task, get_client, get_run_logger, task
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.objects import TaskRun
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import State

from elmo_core.analysis.task_runs import DEFAULT_FRACTIONS
from elmo_core.data.reader import load_manifest
from elmo_core.errors import ElmoError
from elmo_core.tasks import load_task_config
from elmo_core.tasks.seeds import DEFAULT_SEEDS
from flows.artifacts import (
    analysis_markdown,
    dataset_lines,
    dataset_rows,
    publish_markdown,
    publish_table,
    registry_line,
    run_link_line,
    summary_markdown,
    summary_metrics,
    task_rows,
)
from flows.cache import PrepareCachePolicy, dataset_exists, result_storage
from flows.following import stage_followed, train_run_link, training_followed
from flows.params import DataParams, EmbedParams, TrainingParams
from flows.runs import flow_run_link, flow_tags
from pipelines.adapt import stage as adapt_stage
from pipelines.adapt.figures import task_scores_figure
from pipelines.adapt.stage import AdaptResult, result_line
from pipelines.analyze import stage as analyze_stage
from pipelines.analyze.stage import AnalyzeResult
from pipelines.analyze.table import format_rows
from pipelines.common.handoff import HandOn, TrainResult
from pipelines.common.task_data import check_tasks
from pipelines.embed import stage as embed_stage
from pipelines.embed.stage import EmbedResult
from pipelines.evaluate import stage as evaluate_stage
from pipelines.evaluate.result import EvaluationResult
from pipelines.prepare import stage as prepare_stage
from pipelines.registry.register import RegisteredBiLM, register_trained
from pipelines.tracking.figures import log_figure
from pipelines.tracking.flow_runs import mlflow_link, record_summary
from pipelines.train import stage as train_stage
from pipelines.train.preflight import TrainPlan, plan_training

# The hand-written sense set the ``pretrain`` flow's analysis probes (``analyze: true``), found
# from this checkout as flows/run_local.py finds the bundled task.
_SENSE_DATA = Path(__file__).resolve().parents[1] / "examples" / "analysis" / "data"
BUNDLED_SENSES = (_SENSE_DATA / "senses.train.tsv", _SENSE_DATA / "senses.test.tsv")


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


# --- prepare ------------------------------------------------------------------------------------


@task(
    name="prepare",
    task_run_name=lambda: f"prepare-{prefect.runtime.task_run.parameters['data'].corpus_name()}",
    cache_policy=PrepareCachePolicy(),
    persist_result=True,
    retries=2,
    retry_delay_seconds=[10, 60],
    retry_condition_fn=_transient,
)
def _prepare(data: DataParams, parent_run_id: str | None = None) -> str:
    result = prepare_stage.prepare(
        data.prepare_config(),
        data.corpus,
        data.dataset_dir(),
        overwrite=data.overwrite,
        parent_run_id=parent_run_id,
        tags=flow_tags(),
    )
    return result.dataset


def prepare(data: DataParams, parent_run_id: str | None = None) -> str:
    """The dataset directory; cached across flow runs, rebuilt when its manifest is gone. Its
    statistics are logged and published as soon as it is there."""
    missing = not dataset_exists(data.dataset_dir())
    task = _prepare.with_options(result_storage=result_storage(), refresh_cache=missing)
    dataset = task(data, parent_run_id)
    manifest = load_manifest(dataset)
    for line in dataset_lines(manifest):
        get_run_logger().info(line)
    publish_table("dataset-statistics", dataset_rows(manifest), "dataset statistics")
    return dataset


# --- train --------------------------------------------------------------------------------------


@task(name="train", task_run_name="train-{plan.name}")
def _train(
    dataset: str, training: TrainingParams, parent_run_id: str, plan: TrainPlan
) -> TrainResult:
    """The train stage on the run the flow planned; while it trains, this task's log follows it
    (:func:`training_followed`), so the task's own page shows its progress, and its workers print
    none of it twice."""
    with training_followed(plan, parent_run_id) as followed:
        result = train_stage.train(
            training.job_config(),
            dataset,
            where=training.resolved_mode(),
            parent_run_id=parent_run_id,
            tags=flow_tags(),
            console=False,
            plan=plan,
        )
    if not followed.linked.is_set():  # reused, or done before the first look
        get_run_logger().info(train_run_link(plan.name, result.mlflow_run_id))
    followed.progress.finished(result.summary())
    return result


def train(dataset: str, training: TrainingParams, parent_run_id: str) -> TrainResult:
    """The train stage, in process or as a Ray Job (it reuses a finished run). The flow's log
    names the run as the stage plans it, before it starts, and says what it did; the train
    task's log follows it."""
    logger = get_run_logger()
    plan = plan_training(training.job_config(), dataset)  # a mistake fails here, in seconds
    logger.info(f"train: biLM {plan.name}, preset {training.model}, dataset {Path(dataset).name}")
    result = _train(dataset, training, parent_run_id, plan)
    logger.info(result.summary())
    return result


# --- evaluate, register, adapt, analyze, embed ----------------------------------------------------


def stage_task_run_name(stage: str) -> str:
    """``adapt-docstrings-ner``: the stage and the tasks (their files' stems) it works on."""
    paths = prefect.runtime.task_run.parameters.get("task_paths") or []
    return "-".join([stage, *(Path(path).stem for path in paths)])


@task(name="evaluate", task_run_name="evaluate-{run.run_name}")
def evaluate(
    run: TrainResult, dataset: str, parent_run_id: str, hand_on: HandOn
) -> EvaluationResult:
    """Full-softmax heldout perplexity of the run's model that ``hand_on`` picks."""
    handed = run.handed_on(hand_on)
    get_run_logger().info(f"evaluate: {handed.description}")
    result = evaluate_stage.evaluate_trained(
        run, dataset, hand_on=hand_on, parent_run_id=parent_run_id, tags=flow_tags()
    )
    get_run_logger().info(result.summary())
    if result.run_id:
        get_run_logger().info(run_link_line("evaluate run", mlflow_link(result.run_id)))
    publish_table("heldout-perplexity", result.rows(), "heldout perplexity")
    return result


REGISTRY_LOCK = "elmo-registry"  # a Prefect global concurrency limit of one slot


@contextmanager
def registry_lock() -> Iterator[None]:
    """One flow run at a time registers and judges a version, across every flow run on the
    server: two that finish together would otherwise both be measured against the same champion
    (the last alias set wins), or both register a training run that neither found registered.
    The limit is made on first use; Prefect renews the lease while registration runs."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(REGISTRY_LOCK)
        except ObjectNotFound:  # asked first: the server logs a refused duplicate as an error
            with suppress(ObjectAlreadyExists):
                limit = GlobalConcurrencyLimitCreate(name=REGISTRY_LOCK, limit=1)
                client.create_global_concurrency_limit(limit)
    with concurrency(REGISTRY_LOCK, occupy=1, strict=True):
        yield


@task(name="register", task_run_name="register-{run.run_name}")
def register(
    run: TrainResult,
    dataset: str,
    evaluation: EvaluationResult,
    name: str,
    parent_run_id: str,
    hand_on: HandOn,
) -> RegisteredBiLM:
    """The run's version of ``name`` (its model that ``hand_on`` picks, as :func:`evaluate`'s):
    registered and judged by the champion policy once per training run (a re-run gets the same
    version and decision back), one flow run at a time (:func:`registry_lock`)."""
    with registry_lock():
        registered = register_trained(
            run,
            dataset,
            evaluation,
            hand_on=hand_on,
            name=name,
            parent_run_id=parent_run_id,
            tags=flow_tags(),
        )
    get_run_logger().info(registry_line(registered))
    get_run_logger().info(run_link_line("register run", mlflow_link(registered.run_id)))
    return registered


def check_task_files(paths: list[str]) -> None:
    """Load every task config and check its data files now, so a bad path, key or task set fails
    before training starts; none (a pretraining with no tasks) is nothing to check."""
    if paths:
        check_tasks([load_task_config(path) for path in paths])


@task(name="adapt", task_run_name=lambda: stage_task_run_name("adapt"))
def adapt(
    bilm: str,
    task_paths: list[str],
    parent_run_id: str,
    bilm_options: str | None = None,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> list[AdaptResult]:
    """One adaptation job per task (in parallel on Ray), each an ``elmo-<task>`` model."""
    if not task_paths:
        return []
    configs = [load_task_config(path) for path in task_paths]
    names = ", ".join(config.name for config in configs)
    starting = f"adapt {names}: starting (Ray tasks, the biLM, the task data)"
    with stage_followed(parent_run_id, "adapt", len(configs), starting) as bar:
        results = adapt_stage.adapt(
            configs,
            bilm,
            bilm_options=bilm_options,
            seeds=seeds,
            parent_run_id=parent_run_id,
            tags=flow_tags(),
        )
    bar.finished(f"adapted {names}, each with and without ELMo over {len(seeds)} seeds")
    for result in results:
        get_run_logger().info(result_line(result))
        what = f"adapt run of task {result.task}"
        get_run_logger().info(run_link_line(what, mlflow_link(result.run_id)))
    publish_table("task-scores", task_rows(results), "task scores with and without ELMo")
    return results


def check_analysis(task_paths: list[str], fractions: Sequence[float], seeds: Sequence[int]) -> None:
    """What the ``pretrain`` flow's analysis will read, checked before training, not after it."""
    configs = [load_task_config(path) for path in task_paths]
    analyze_stage.check_inputs(configs, BUNDLED_SENSES, fractions, seeds)


@task(name="analyze", task_run_name=lambda: stage_task_run_name("analyze"))
def analyze(
    bilm: str,
    task_paths: list[str],
    parent_run_id: str,
    *,
    bilm_options: str | None = None,
    senses: tuple[Path, Path] | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
) -> AnalyzeResult:
    """The paper's section 5 on ``bilm`` as one ``analyze`` run, a child of the flow's; its table
    goes to the flow's log and to the ``analysis`` artifact."""
    configs = [load_task_config(path) for path in task_paths]
    names = ", ".join(config.name for config in configs)
    starting = f"analyze {names}: starting (the biLM's activations of every sentence, cached)"
    with stage_followed(parent_run_id, "analyze", 1, starting) as bar:
        result = analyze_stage.analyze(
            configs,
            bilm,
            bilm_options=bilm_options,
            senses=senses,
            fractions=fractions,
            seeds=seeds,
            parent_run_id=parent_run_id,
            tags=flow_tags(),
            console=False,  # its progress is this task's log
        )
    bar.finished(f"analyzed {names}: {len(result.rows)} rows")
    if result.reused:
        get_run_logger().info("analysis reused: a finished analyze run of this biLM and settings")
    for line in [*format_rows(result.rows).splitlines(), *result.headline]:
        get_run_logger().info(line)
    get_run_logger().info(run_link_line("analyze run", mlflow_link(result.run_id)))
    run_ids = {"flow (parent)": parent_run_id, "analyze": result.run_id}
    publish_markdown("analysis", analysis_markdown(bilm, result.rows, run_ids), "analysis table")
    return result


@task(name="embed")
def embed(params: EmbedParams, parent_run_id: str) -> EmbedResult:
    """The embed stage on ``params``, its run a child of the flow's."""
    result = embed_stage.embed(
        params.bilm,
        params.input,
        params.out_dir(),
        options=params.bilm_options,
        output=params.output,
        format=params.format,
        dtype=params.dtype,
        batch_size=params.batch_size,
        concurrency=params.concurrency,
        sentences_per_shard=params.sentences_per_shard,
        tokenized=params.tokenized,
        manifest=params.manifest,
        parent_run_id=parent_run_id,
        tags=flow_tags(),
    )
    get_run_logger().info(embed_stage.summary_line(result))
    get_run_logger().info(run_link_line("embed run", mlflow_link(result.run_id)))
    return result


# --- summary ------------------------------------------------------------------------------------

TASK_SCORES_FIGURE = "task_scores.png"  # the parent run's: every task with and without ELMo


@task(name="summarize", task_run_name="summarize")
def summarize(
    dataset: str,
    run: TrainResult,
    hand_on: HandOn,
    evaluation: EvaluationResult,
    model: RegisteredBiLM,
    results: list[AdaptResult],
    parent_run_id: str,
    analysis: AnalyzeResult | None = None,
) -> None:
    """The markdown summary linking to MLflow and Prefect, also made the parent run's
    description, with the headline numbers as its metrics and the dataset statistics beside
    them."""
    run_ids = {"flow (parent)": parent_run_id}
    prepared = prepare_stage.prepare_run_id(dataset)
    if prepared is not None:  # this flow's, or the earlier one whose dataset it reused
        run_ids["prepare"] = prepared
    run_ids["train"] = run.mlflow_run_id
    if evaluation.run_id:
        run_ids["evaluate"] = evaluation.run_id
    run_ids["register"] = model.run_id
    run_ids.update({f"adapt {r.task}": r.run_id for r in results})
    if analysis is not None:
        run_ids["analyze"] = analysis.run_id
    headline = analysis.headline if analysis is not None else []
    stages = (run, hand_on, evaluation, model, results, run_ids, headline, flow_run_link())
    publish_markdown("pretrain-summary", summary_markdown(*stages))
    inside = summary_markdown(*stages, inside_mlflow=True)
    manifest = load_manifest(dataset)
    record_summary(
        parent_run_id,
        summary_metrics(evaluation, results),
        {"summary.md": inside, "dataset.json": json.dumps(dataset_rows(manifest), indent=1)},
        inside,
    )
    if results:
        log_figure(task_scores_figure(results), TASK_SCORES_FIGURE, run_id=parent_run_id)
    what = "the summary (the parent run's description)"
    get_run_logger().info(run_link_line(what, mlflow_link(parent_run_id)))
