"""What an adapt run records in MLflow: its inputs, curves, final scores, the task model.

Every metric of the one ``adapt`` run sits under ``task/`` (MLflow orders chart sections by name,
so the biLM's ``bilm/...`` come first): per-epoch curves and final scores under ``task/elmo/``,
``task/baseline/`` and ``task/gain/`` (ELMo − baseline), of the first seed's models, plus
``_mean`` and ``_spread`` over seeds; every other score goes to ``scores.json``. Params are the task
config's fields that apply to its format and type (``config.json`` holds it whole).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow

from elmo_core.location import sha256_file
from elmo_core.tasks.dataset import PairExample
from elmo_core.tasks.seeds import Scores
from elmo_core.tasks.task_config import SPLITS, TaskConfig
from elmo_core.tasks.task_model import Example
from elmo_core.tasks.trainer import TaskResult, main_metric
from pipelines.models import task_pyfunc
from pipelines.models.bilm_loader import BiLMReference, LoadedBiLM
from pipelines.registry.model_card import ModelCard, example_frame, publish_card
from pipelines.registry.register import model_requirements
from pipelines.registry.tags import KIND_TAG, TASK_TAG, gain_tag, score_tag
from pipelines.tracking import stage_runs
from pipelines.tracking.stage_runs import (
    flatten_params,
    log_input_file,
    logged_model_tags,
    register_model,
)

SCORES_FILE = "scores.json"
SOURCE_NAME = "pipelines.adapt"
# The fields of ReaderConfig that each format reads, and of HeadConfig that each task type builds
# on (besides the encoder's hidden_dim, num_layers, dropout and elmo_at_output, which all use).
READER_FIELDS: dict[str, tuple[str, ...]] = {
    "conll2003": ("tag_scheme",),
    "conllu": ("conllu_column",),
    "sst": ("sst_phrases",),
    "label_text": (),
    "tsv": ("tsv_label_column", "tsv_header"),
    "snli": ("snli_tokenization",),
}
HEAD_FIELDS: dict[str, tuple[str, ...]] = {
    "tagging": ("crf",),
    "classification": ("pooling",),
    "pair": ("pair_head", "pooling"),
}
DATA_CONTEXTS = {"train": "training", "dev": "validation", "test": "testing"}
MAX_LABELS_SHOWN = 12
WHAT_IT_DOES = {
    "tagging": "A tag for every token",
    "classification": "A label for every sentence",
    "pair": "A label for every premise–hypothesis pair",
}
OUTPUTS = {
    "tagging": f"`{task_pyfunc.TOKENS}` (the tokens read), `{task_pyfunc.TAGS}` (one per token)",
    "classification": f"`{task_pyfunc.TOKENS}` (the tokens read), `{task_pyfunc.LABEL}`",
    "pair": f"`{task_pyfunc.LABEL}`",
}


@dataclass(frozen=True)
class TaskModelVersion:
    """The registered ``elmo-<task>`` version and the logged model it was registered from."""

    name: str
    version: int
    model_id: str


@dataclass(frozen=True)
class SeedRun:
    """The ELMo model and the baseline trained with one seed."""

    seed: int
    elmo: TaskResult
    baseline: TaskResult


def headline_score(result: TaskResult) -> float:
    """The main metric on test, or on dev when the task has no test split (NaN: neither)."""
    for split in (result.test_metrics, result.dev_metrics):
        if result.metric in split:
            return split[result.metric]
    return float("nan")


def task_metric(model: str, name: str) -> str:
    """``task/<model>/<name>``, ``model`` being ``elmo``, ``baseline`` or ``gain``."""
    return f"task/{model}/{name}"


def seed_metrics(runs: Sequence[SeedRun]) -> dict[str, float]:
    """Each model's mean and spread of the main score over the seeds, and the mean gain."""
    split = "test" if runs[0].elmo.test_metrics else "dev"
    name = f"{split}_{runs[0].elmo.metric}"
    elmo = Scores(tuple(headline_score(run.elmo) for run in runs))
    baseline = Scores(tuple(headline_score(run.baseline) for run in runs))
    return {
        task_metric("elmo", f"{name}_mean"): elmo.mean,
        task_metric("elmo", f"{name}_spread"): elmo.spread,
        task_metric("baseline", f"{name}_mean"): baseline.mean,
        task_metric("baseline", f"{name}_spread"): baseline.spread,
        task_metric("gain", f"{name}_mean"): elmo.mean - baseline.mean,
    }


def source_tags(parent_run_id: str | None) -> dict[str, str]:
    """MLflow's source tags for a run created in a Ray worker, where MLflow's own guess would be
    Ray's ``default_worker.py``: the stage's module, ``JOB`` inside a flow (a parent run)."""
    return stage_runs.source_tags(SOURCE_NAME, job=parent_run_id is not None)


def task_params(task: TaskConfig) -> dict[str, str]:
    """The task config as params, without the reader and head options its kind never reads."""
    config = task.model_dump(mode="json")
    config["reader"] = {key: config["reader"][key] for key in READER_FIELDS[task.format]}
    type_specific = {field for fields in HEAD_FIELDS.values() for field in fields}
    unused = type_specific - set(HEAD_FIELDS[task.type])
    if task.type == "pair" and task.head.pair_head == "esim":
        unused.add("pooling")  # ESIM pools both ways itself; only "match" reads it
    config["head"] = {key: value for key, value in config["head"].items() if key not in unused}
    return flatten_params(config)


def log_task_data(task: TaskConfig) -> None:
    """The task's files as the run's datasets (source: the path, digest: the file's sha256); a
    file serving two splits is one dataset with both contexts."""
    contexts: dict[Path, list[str]] = {}
    for split in SPLITS:
        path = task.split_path(split)
        if path is not None:
            contexts.setdefault(path, []).append(DATA_CONTEXTS[split])
    for path, names in contexts.items():
        log_input_file(str(path), path.name, sha256_file(path), "+".join(names))


def epoch_logger(prefix: str, metric: str) -> Callable[[int, dict[str, float]], None]:
    """An ``epoch_callback`` for ``train_task``: ``task/<prefix>/train_loss``, the main dev score
    and the mix at step ``epoch``; the other dev scores stay in the trainer's history."""

    def log_epoch(epoch: int, metrics: dict[str, float]) -> None:
        kept = {
            task_metric(prefix, name): value
            for name, value in metrics.items()
            if not name.startswith("dev_") or name == f"dev_{metric}"
        }
        mlflow.log_metrics(kept, epoch)

    return log_epoch


def gains(elmo: TaskResult, baseline: TaskResult) -> dict[str, float]:
    """``<split>_<score>``: ELMo's score minus the baseline's, for the main metric and accuracy."""
    found: dict[str, float] = {}
    for score in dict.fromkeys((main_metric(elmo.model.task), "accuracy")):
        for split, ours, theirs in (
            ("dev", elmo.dev_metrics, baseline.dev_metrics),
            ("test", elmo.test_metrics, baseline.test_metrics),
        ):
            if score in ours and score in theirs:
                found[f"{split}_{score}"] = ours[score] - theirs[score]
    return found


def final_metrics(elmo: TaskResult, baseline: TaskResult) -> dict[str, float]:
    """The few final single values, by the names above (the main metric only)."""
    metric = main_metric(elmo.model.task)
    found: dict[str, float] = {}
    for prefix, result in (("elmo", elmo), ("baseline", baseline)):
        if metric in result.dev_metrics:
            found[task_metric(prefix, f"best_dev_{metric}")] = result.dev_metrics[metric]
        if metric in result.test_metrics:
            found[task_metric(prefix, f"test_{metric}")] = result.test_metrics[metric]
    gained = gains(elmo, baseline)
    found |= {
        task_metric("gain", key): gained[key]
        for key in (f"dev_{metric}", f"test_{metric}")
        if key in gained
    }
    return found


def scores(
    elmo: TaskResult, baseline: TaskResult, seconds: Mapping[str, float]
) -> dict[str, object]:
    """Everything ``scores.json`` holds (module docstring)."""
    mixes = {
        position: {"weights": weights, "gamma": gamma}
        for position, weights, gamma in (
            ("input", elmo.mix_weights, elmo.gamma),
            ("output", elmo.output_mix_weights, elmo.output_gamma),
        )
        if weights is not None
    }
    return {
        "metric": main_metric(elmo.model.task),
        **{
            prefix: {
                "best_epoch": result.best_epoch,
                "dev": result.dev_metrics,
                "test": result.test_metrics,
            }
            for prefix, result in (("elmo", elmo), ("baseline", baseline))
        },
        "gain": gains(elmo, baseline),
        "mix": mixes,
        "seconds": dict(seconds),
    }


def log_outcome(runs: Sequence[SeedRun], seconds: Mapping[str, float], model_id: str) -> None:
    """The final metrics, linked to the logged task model so its page shows them, and
    ``scores.json``."""
    elmo, baseline = runs[0].elmo, runs[0].baseline
    mlflow.log_metrics(final_metrics(elmo, baseline) | seed_metrics(runs), model_id=model_id)
    by_seed = {
        str(run.seed): {"elmo": headline_score(run.elmo), "baseline": headline_score(run.baseline)}
        for run in runs
    }
    mlflow.log_dict(scores(elmo, baseline, seconds) | {"seeds": by_seed}, SCORES_FILE)


def log_task_model(
    elmo: TaskResult,
    baseline: TaskResult,
    source: LoadedBiLM,
    bilm: BiLMReference,
    scratch: Path,
    example: Mapping[str, str],
) -> TaskModelVersion:
    """Log the ELMo task model as a pyfunc model ``elmo-<task>`` with ``example`` as its input
    example and its run's source tags; register it under that name, tagged with the task, its
    main score and gain and the biLM it was adapted from, and describe it as every registered
    model is (:mod:`pipelines.registry.model_card`)."""
    name = f"elmo-{elmo.task}"
    task_dir = task_pyfunc.save_task_model(elmo.model, scratch / "task", source.tokenizer)
    run = mlflow.active_run()
    assert run is not None  # the adapt run
    info = mlflow.pyfunc.log_model(
        name=name,
        tags=logged_model_tags(mlflow.get_run(run.info.run_id)),
        python_model=task_pyfunc.__file__,
        artifacts={
            task_pyfunc.TASK_ARTIFACT: str(task_dir),
            task_pyfunc.BILM_ARTIFACT: str(source.model_dir),
        },
        signature=task_pyfunc.model_signature(elmo.model.task.type),
        input_example=example_frame(example),
        pip_requirements=model_requirements(),
    )
    headline = Headline.of(elmo, baseline)
    tags = {TASK_TAG: elmo.task, **bilm.tags, **(headline.tags() if headline else {})}
    version = register_model(info.model_uri, name, tags)
    card = task_card(elmo.model.task, elmo.model.labels, bilm.location, version, example)
    scored = headline or "no dev or test split to score it on"
    publish_card(card, version, f"Adapted from `{bilm.location}`: {scored}.")
    return TaskModelVersion(name, version, info.model_id)


@dataclass(frozen=True)
class Headline:
    """The ELMo model's main score on test (dev without a test split) and the baseline's."""

    split: str
    metric: str
    elmo: float
    baseline: float

    @classmethod
    def of(cls, elmo: TaskResult, baseline: TaskResult) -> Headline | None:
        """None when the task has neither a dev nor a test split."""
        metric = main_metric(elmo.model.task)
        for split, ours, theirs in (
            ("test", elmo.test_metrics, baseline.test_metrics),
            ("dev", elmo.dev_metrics, baseline.dev_metrics),
        ):
            if metric in ours:
                return cls(split, metric, ours[metric], theirs[metric])
        return None

    def tags(self) -> dict[str, str]:
        """``elmo.test_<metric>`` and ``elmo.gain.test_<metric>``, for the version."""
        gain = self.elmo - self.baseline
        return {
            score_tag(self.split, self.metric): f"{self.elmo:.4f}",
            gain_tag(self.split, self.metric): f"{gain:+.4f}",
        }

    def __str__(self) -> str:
        """``test f1 0.9123 (baseline 0.8512, gain +0.0611)``."""
        gain = self.elmo - self.baseline
        return (
            f"{self.split} {self.metric} {self.elmo:.4f} (baseline {self.baseline:.4f}, "
            f"gain {gain:+.4f})"
        )


def task_card(
    task: TaskConfig, labels: list[str], bilm: str, version: int, example: Mapping[str, str]
) -> ModelCard:
    """What ``elmo-<task>`` is and how to label text with it (its newest version)."""
    shown = ", ".join(f"`{label}`" for label in labels[:MAX_LABELS_SHOWN])
    more = f" and {len(labels) - MAX_LABELS_SHOWN} more" if len(labels) > MAX_LABELS_SHOWN else ""
    return ModelCard(
        name=f"elmo-{task.name}",
        summary=(
            f"{WHAT_IT_DOES[task.type]} for the `{task.name}` task ({task.format} data), by a "
            f"head trained over the frozen ELMo biLM `{bilm}`; labels {shown}{more}"
        ),
        uri=f"models:/elmo-{task.name}/{version}",
        example=example,
        outputs=OUTPUTS[task.type],
        tags={KIND_TAG: "task", TASK_TAG: task.name},
    )


def input_columns(example: Example) -> dict[str, str]:
    """One example as the model's text input columns: ``sentence``, or ``premise`` and
    ``hypothesis`` (tokens joined by spaces; the model tokenizes text again)."""
    if isinstance(example, PairExample):
        premise, hypothesis = task_pyfunc.PAIR_SIDES
        return {premise: " ".join(example.premise), hypothesis: " ".join(example.hypothesis)}
    return {task_pyfunc.SENTENCE: " ".join(example.tokens)}
