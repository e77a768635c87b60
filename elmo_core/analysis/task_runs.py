"""The task runs behind the paper's §5 comparisons, each over several seeds.

Sample efficiency (§5.5), one biLM layer against the learned mix (§5.3), and where ELMo enters
the task model (§5.2). A fraction trains for as many updates as the whole split; the full-data
ELMo run with the mix at the input serves all three comparisons, so it runs once per seed. Each
finished run's outcome can be kept (:class:`FinishedRuns`), so an analysis stopped after hours
resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from elmo_core.analysis.sampling import check_fractions, subsample
from elmo_core.tasks.readers import task_labels
from elmo_core.tasks.seeds import DEFAULT_SEEDS, Scores
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import TaskResult, TaskSplit, main_metric, train_task

DEFAULT_FRACTIONS = (0.01, 0.05, 0.1, 0.25, 1.0)
MIX = "mix"  # the per-layer comparison's learned mix of every layer
INPUT, INPUT_OUTPUT = "input", "input+output"  # ELMo's placements
Progress = Callable[[str], object]


@dataclass
class TaskAnalysis:
    """One task's comparisons: ``efficiency[fraction]["elmo" | "baseline"]``, ``layers[j | mix]``,
    ``placement[input | input+output]`` and the learned mix's weights, mean over seeds."""

    task: str
    metric: str  # e.g. "test_accuracy"
    efficiency: dict[float, dict[str, Scores]] = field(default_factory=dict)
    layers: dict[str, Scores] = field(default_factory=dict)
    placement: dict[str, Scores] = field(default_factory=dict)
    mix_weights: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RunOutcome:
    """What the comparisons read of one trained task model."""

    metric: str
    dev_metrics: dict[str, float]
    test_metrics: dict[str, float]
    mix_weights: list[float] | None = None

    @classmethod
    def of(cls, result: TaskResult) -> RunOutcome:
        return cls(result.metric, result.dev_metrics, result.test_metrics, result.mix_weights)


class FinishedRuns:
    """The outcome of each finished run, one JSON file per run in ``directory``, named by a hash
    of what the run trained. The directory must belong to one biLM, task data and code version
    (the caller's key): the run's own key covers only its config, seed and part of the data."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, key: str) -> RunOutcome | None:
        path = self.directory / f"{key}.json"
        return RunOutcome(**json.loads(path.read_text())) if path.is_file() else None

    def put(self, key: str, outcome: RunOutcome) -> None:
        """Written whole or not at all: a run killed while writing is trained again."""
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f".{key}.{uuid.uuid4().hex}"
        staging.write_text(json.dumps(dataclasses.asdict(outcome)))
        os.replace(staging, self.directory / f"{key}.json")


def analyze_task(
    task: TaskConfig,
    splits: Mapping[str, TaskSplit],
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    finished: FinishedRuns | None = None,
) -> TaskAnalysis:
    """Every run of the three comparisons for ``task`` (``splits``: train, and dev/test); a run
    whose outcome ``finished`` holds is not trained again."""
    train = splits["train"]
    if train.activations is None:
        raise ValueError("the analysis needs the cached activations of the training split")
    num_layers = train.activations.num_layers
    check_fractions(list(train.dataset.examples), fractions, task.name)
    split = "test" if "test" in splits else "dev"
    analysis = TaskAnalysis(task.name, f"{split}_{main_metric(task)}")
    head = task.head.model_copy(update={"elmo_at_output": False, "elmo_layers": None})
    # The labels of the whole training split: a fraction may lack a rare tag that dev or test has.
    labels = task_labels(task, train.dataset)
    base = task.model_copy(update={"head": head, "labels": labels})
    total = num_runs(fractions, seeds, num_layers)
    runs = _Runs(splits, split, device, progress, finished, total=total)
    full: dict[int, RunOutcome] = {}
    for fraction in sorted(fractions):
        scores: dict[str, list[float]] = {"elmo": [], "baseline": []}
        for seed in seeds:
            part = _fraction_of(train, fraction, seed)
            budget = same_updates(base, len(train.dataset.examples), len(part.dataset.examples))
            for name, use_elmo in (("elmo", True), ("baseline", False)):
                what = f"{fraction:g} of train, {name}"
                result = runs.train(budget, part, use_elmo, seed, what)
                scores[name].append(runs.score(result))
                if use_elmo and fraction == 1.0:
                    full[seed] = result
        analysis.efficiency[fraction] = {name: Scores(tuple(v)) for name, v in scores.items()}
    if not full:  # 1.0 was not among the fractions: the shared run is made here
        full = {seed: runs.train(base, train, True, seed, "all of train, elmo") for seed in seeds}
    analysis.layers[MIX] = analysis.placement[INPUT] = Scores(
        tuple(runs.score(full[seed]) for seed in seeds)
    )
    analysis.mix_weights = _mean_weights([full[seed].mix_weights or [] for seed in seeds])
    for layer in range(num_layers):
        alone = _with_head(base, elmo_layers=[layer])
        analysis.layers[str(layer)] = runs.scores(alone, train, seeds, f"layer {layer} alone")
    both = _with_head(base, elmo_at_output=True)
    analysis.placement[INPUT_OUTPUT] = runs.scores(both, train, seeds, "ELMo at input and output")
    return analysis


@dataclass
class _Runs:
    """Trains runs one after another, reporting each to ``progress``, keeping each outcome in
    ``finished`` and taking the outcomes it already holds."""

    splits: Mapping[str, TaskSplit]
    split: str
    device: str | torch.device
    progress: Progress | None
    finished: FinishedRuns | None
    total: int
    done: int = 0

    def train(
        self, task: TaskConfig, train: TaskSplit, use_elmo: bool, seed: int, what: str
    ) -> RunOutcome:
        key = _run_key(task, len(train.dataset.examples), use_elmo, seed, what)
        outcome = self.finished.get(key) if self.finished is not None else None
        earlier = outcome is not None
        if outcome is None:
            result = train_task(
                task,
                train,
                self.splits.get("dev"),
                self.splits.get("test"),
                use_elmo,
                seed=seed,
                device=self.device,
            )
            outcome = RunOutcome.of(result)
            if self.finished is not None:
                self.finished.put(key, outcome)
        self.done += 1
        if self.progress is not None:
            self.progress(
                f"{task.name}: run {self.done}/{self.total}, {what}, seed {seed}: "
                f"{self.split} {outcome.metric} {self.score(outcome):.4f}"
                + (" (finished earlier)" if earlier else "")
            )
        return outcome

    def score(self, result: RunOutcome) -> float:
        scores = result.test_metrics if self.split == "test" else result.dev_metrics
        return scores[result.metric]

    def scores(self, task: TaskConfig, train: TaskSplit, seeds: Sequence[int], what: str) -> Scores:
        return Scores(
            tuple(self.score(self.train(task, train, True, seed, what)) for seed in seeds)
        )


def _run_key(task: TaskConfig, examples: int, use_elmo: bool, seed: int, what: str) -> str:
    """A run's name in :class:`FinishedRuns`: its config (epochs, head), the size of its part of
    the training split, which input, which seed and which comparison it serves."""
    run = {"task": task.model_dump(mode="json"), "examples": examples, "elmo": use_elmo}
    run |= {"seed": seed, "what": what}
    return hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()[:32]


def _fraction_of(train: TaskSplit, fraction: float, seed: int) -> TaskSplit:
    if fraction == 1.0:
        return train
    return train.subset(subsample(list(train.dataset.examples), fraction, seed))


def same_updates(task: TaskConfig, full: int, part: int) -> TaskConfig:
    """``task`` with as many epochs over ``part`` examples as make the updates of its epochs over
    ``full``, scored on dev as often as those (once per ``full`` epoch's updates): a smaller
    fraction must not lose by training less, nor spend its time scoring dev after each of its
    short epochs (early stopping still ends it, its patience counted in those scorings)."""
    settings = task.training
    if part >= full:
        return task
    epochs = math.ceil(settings.epochs * full / max(part, 1))
    every = settings.eval_every or math.ceil(full / settings.batch_size)
    training = settings.model_copy(update={"epochs": epochs, "eval_every": every})
    return task.model_copy(update={"training": training})


def _with_head(task: TaskConfig, **head: object) -> TaskConfig:
    return task.model_copy(update={"head": task.head.model_copy(update=head)})


def _mean_weights(per_seed: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.fmean(weights) for weights in zip(*per_seed, strict=True)]


def num_runs(fractions: Sequence[float], seeds: Sequence[int], num_layers: int) -> int:
    """How many task models :func:`analyze_task` trains."""
    shared = 0 if 1.0 in fractions else 1
    return len(seeds) * (2 * len(fractions) + shared + num_layers + 1)
