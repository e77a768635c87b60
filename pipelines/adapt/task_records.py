"""What an adapt run records in MLflow: its inputs, curves, final scores, the task model.

Every metric sits under ``task/`` so that MLflow, ordering chart sections by name, shows the biLM's
``bilm/...`` first. Final scores are means over the seeds, each seed's own score a row of the
``seed_scores.json`` table; the registered model holds the first seed's weights, and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.models.model import ModelInfo

from elmo_core.location import sha256_file
from elmo_core.tasks.seeds import Scores, difference
from elmo_core.tasks.task_config import SPLITS, TaskConfig
from elmo_core.tasks.trainer import TaskResult, main_metric
from elmo_core.tasks.types import TASK_TYPES, task_type
from pipelines.registry.model_card import ModelCard, example_frame, publish_card
from pipelines.registry.register import model_requirements
from pipelines.registry.tags import (
    KIND_TAG,
    SEEDS_TAG,
    TASK_TAG,
    WEIGHTS_SEED_TAG,
    gain_tag,
    score_tag,
    sd_tag,
)
from pipelines.serving import task_pyfunc
from pipelines.serving.bilm_loader import BiLMReference, LoadedBiLM
from pipelines.tracking.datasets import log_input_file
from pipelines.tracking.logged_models import log_model_at, register_model
from pipelines.tracking.stage_runs import CONFIG_ARTIFACT, flatten_params, location_link

SCORES_FILE = "scores.json"
SEEDS_TABLE = "seed_scores.json"  # each seed's headline score, with ELMo and without
DATA_CONTEXTS = {"train": "training", "dev": "validation", "test": "testing"}
MAX_LABELS_SHOWN = 12
MODELS = ("elmo", "baseline")  # the two models each seed trains


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


def task_metric(model: str, name: str, seed: int | None = None) -> str:
    """``task/summary/<model>/<name>``, ``model`` being ``elmo``, ``baseline`` or ``gain``: the
    final scores over the seeds; with ``seed``, ``task/seed_<seed>/<model>/<name>``: that seed's
    per-epoch curve. MLflow orders chart sections by name: the curves come first, the final
    scores' few points after them."""
    return f"task/summary/{model}/{name}" if seed is None else f"task/seed_{seed}/{model}/{name}"


def split_scores(runs: Sequence[SeedRun], model: str, split: str, metric: str) -> Scores | None:
    """``model``'s ``metric`` on ``split`` (its best epoch's on dev) over the seeds, or None
    where the split has none."""
    results = [getattr(run, model) for run in runs]
    found = [(r.test_metrics if split == "test" else r.dev_metrics).get(metric) for r in results]
    return Scores(tuple(found)) if all(value is not None for value in found) else None  # type: ignore[arg-type]


def final_metrics(runs: Sequence[SeedRun]) -> dict[str, float]:
    """The run's final scores of the main metric, each the mean over the seeds (their standard
    deviations are the description's and the version's tags: one value makes no chart)."""
    metric = main_metric(runs[0].elmo.model.task)
    found: dict[str, float] = {}
    for split, name in (("dev", f"best_dev_{metric}"), ("test", f"test_{metric}")):
        elmo, baseline = (split_scores(runs, model, split, metric) for model in MODELS)
        for model, scores in (("elmo", elmo), ("baseline", baseline)):
            if scores is not None:
                found[task_metric(model, name)] = scores.mean
        if elmo is not None and baseline is not None:
            found[task_metric("gain", f"{split}_{metric}")] = elmo.mean - baseline.mean
    return found


def seed_table(runs: Sequence[SeedRun]) -> dict[str, list[float | int]]:
    """Each seed's headline score with ELMo and without, a row per seed: a table, since seeds
    are no steps of anything."""
    return {
        "seed": [run.seed for run in runs],
        **{model: [headline_score(getattr(run, model)) for run in runs] for model in MODELS},
    }


def task_params(task: TaskConfig) -> dict[str, str]:
    """The task config as params, without the head options its kind never reads."""
    config = task.model_dump(mode="json")
    kind = task_type(task.type)
    type_specific = {option for other in TASK_TYPES.values() for option in other.head_options}
    unused = type_specific - set(kind.options_read(task))
    config["head"] = {key: value for key, value in config["head"].items() if key not in unused}
    return flatten_params(config, whole_in=CONFIG_ARTIFACT)


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


def epoch_logger(prefix: str, metric: str, seed: int) -> Callable[[int, dict[str, float]], None]:
    """An ``epoch_callback`` for ``train_task``: ``task/seed_<seed>/<prefix>/train_loss``, the
    main dev score and the mix at step ``epoch``; the other dev scores stay in the trainer's
    history."""

    def log_epoch(epoch: int, metrics: dict[str, float]) -> None:
        kept = {
            task_metric(prefix, name, seed): value
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


def scores(
    elmo: TaskResult, baseline: TaskResult, seconds: Mapping[str, float]
) -> dict[str, object]:
    """Everything ``scores.json`` holds of one seed's models (module docstring)."""
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
    """The final metrics, linked to the logged task model so its page shows them; each seed's
    headline as a table; and ``scores.json``: every score of the registered seed's models, and
    each seed's headline."""
    mlflow.log_metrics(final_metrics(runs), model_id=model_id)
    mlflow.log_table(seed_table(runs), SEEDS_TABLE)
    by_seed = {
        str(run.seed): {"elmo": headline_score(run.elmo), "baseline": headline_score(run.baseline)}
        for run in runs
    }
    registered = runs[0]
    mlflow.log_dict(
        {"registered_seed": registered.seed}
        | scores(registered.elmo, registered.baseline, seconds)
        | {"seeds": by_seed},
        SCORES_FILE,
    )


def log_task_model(
    runs: Sequence[SeedRun],
    examples: Mapping[str, int],
    source: LoadedBiLM,
    bilm: BiLMReference,
    scratch: Path,
    example: Mapping[str, str],
) -> TaskModelVersion:
    """Log the first seed's ELMo task model as a pyfunc model ``elmo-<task>`` at the epoch it
    was kept (:func:`log_model_at`), with ``example`` as its input example and its run's source
    tags; register it under that name, tagged with the
    task, its scores over the seeds (:class:`Headline`) and the biLM it was adapted from, and
    describe it as every registered model is (:mod:`pipelines.registry.model_card`).
    ``examples``: each split's size."""
    elmo = runs[0].elmo
    name = f"elmo-{elmo.task}"
    task_dir = task_pyfunc.save_task_model(elmo.model, scratch / "task", source.tokenizer)
    run = mlflow.active_run()
    assert run is not None  # the adapt run

    def log(model_id: str) -> ModelInfo:
        return mlflow.pyfunc.log_model(
            name=name,
            model_id=model_id,
            python_model=task_pyfunc.__file__,
            artifacts={
                task_pyfunc.TASK_ARTIFACT: str(task_dir),
                task_pyfunc.BILM_ARTIFACT: str(source.model_dir),
            },
            signature=task_pyfunc.model_signature(elmo.model.task.type),
            input_example=example_frame(example),
            pip_requirements=model_requirements(),
        )

    own = [task_metric("elmo", "", runs[0].seed)]  # its seed's curves, at its kept epoch
    kept = "the best on dev" if elmo.dev_metrics else "the last: no dev split"
    described = (
        f"The {elmo.task} model with ELMo of seed {runs[0].seed}, as it was at epoch "
        f"{elmo.best_epoch} (kept: {kept}). Its final scores here are the means over "
        f"seeds {', '.join(str(r.seed) for r in runs)}; its curves, that seed's at that epoch."
    )
    info = log_model_at(
        name, run.info.run_id, elmo.best_epoch, log, description=described, own_metrics=own
    )
    headline = Headline.of(runs, examples)
    tags = {TASK_TAG: elmo.task, **bilm.tags, **(headline.tags() if headline else {})}
    version = register_model(info.model_uri, name, tags)
    card = task_card(elmo.model.task, elmo.model.labels, bilm.location, version, example)
    scored = headline or "no dev or test split to score it on"
    adapted_from = location_link(bilm.location, relative=True)
    publish_card(card, version, f"Adapted from {adapted_from}: {scored}.")
    return TaskModelVersion(name, version, info.model_id)


@dataclass(frozen=True)
class Headline:
    """The main score on test (dev without a test split) over the seeds, with ELMo and without,
    and the seed whose weights the registered version holds: one seed's score alone can say the
    opposite of the means, so a version states both and says which is which."""

    split: str
    metric: str
    elmo: Scores
    baseline: Scores
    seeds: tuple[int, ...]  # the first holds the registered weights
    examples: int  # the split's size: one error moves the score by about 1/examples

    @classmethod
    def of(cls, runs: Sequence[SeedRun], examples: Mapping[str, int]) -> Headline | None:
        """None when the task has neither a dev nor a test split."""
        metric = main_metric(runs[0].elmo.model.task)
        for split in ("test", "dev"):
            elmo, baseline = (split_scores(runs, model, split, metric) for model in MODELS)
            if elmo is not None and baseline is not None:
                seeds = tuple(run.seed for run in runs)
                return cls(split, metric, elmo, baseline, seeds, examples.get(split, 0))
        return None

    def tags(self) -> dict[str, str]:
        """The means over the seeds, ELMo's standard deviation over them (``_sd``), the seeds
        and the registered one."""
        gain = self.elmo.mean - self.baseline.mean
        return {
            score_tag(self.split, self.metric): f"{self.elmo.mean:.4f}",
            sd_tag(self.split, self.metric): f"{self.elmo.sd:.4f}",
            gain_tag(self.split, self.metric): f"{gain:+.4f}",
            SEEDS_TAG: ",".join(map(str, self.seeds)),
            WEIGHTS_SEED_TAG: str(self.seeds[0]),
        }

    def __str__(self) -> str:
        """``test f1 0.9123 ± 0.0100 with ELMo, 0.8512 ± 0.0200 without (mean ± sample standard
        deviation over seeds 0, 1, 2; 300 test examples): gain +0.0611, beyond the gain's
        standard deviation (0.0224). This version holds seed 0's weights (test f1 0.9200)``."""
        seeds = ", ".join(map(str, self.seeds))
        over = f"mean ± sample standard deviation over seeds {seeds}"
        if len(self.seeds) == 1:
            over = f"seed {seeds}"
        size = f"; {self.examples:,} {self.split} examples" if self.examples else ""
        line = (
            f"{self.split} {self.metric} {self.elmo} with ELMo, {self.baseline} without "
            f"({over}{size}): {difference(self.elmo, self.baseline)}"
        )
        if len(self.seeds) == 1:
            return line
        return (
            f"{line}. This version holds seed {self.seeds[0]}'s weights ({self.split} "
            f"{self.metric} {self.elmo.values[0]:.4f})"
        )


def task_card(
    task: TaskConfig, labels: list[str], bilm: str, version: int, example: Mapping[str, str]
) -> ModelCard:
    """What ``elmo-<task>`` is and how to label text with it (its newest version)."""
    kind = task_type(task.type)
    shown = ", ".join(f"`{label}`" for label in labels[:MAX_LABELS_SHOWN])
    more = f" and {len(labels) - MAX_LABELS_SHOWN} more" if len(labels) > MAX_LABELS_SHOWN else ""
    return ModelCard(
        name=f"elmo-{task.name}",
        summary=(
            f"{kind.summary} for the `{task.name}` task ({task.format} data), by a "
            f"head trained over the frozen ELMo biLM `{bilm}`; labels {shown}{more}"
        ),
        uri=f"models:/elmo-{task.name}/{version}",
        example=example,
        outputs=", ".join(
            f"`{column.name}` ({column.doc})" if column.doc else f"`{column.name}`"
            for column in kind.outputs()
        ),
        tags={KIND_TAG: "task", TASK_TAG: task.name},
    )
