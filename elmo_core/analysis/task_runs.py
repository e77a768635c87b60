"""The task runs behind the paper's §5 comparisons, each over several seeds.

Sample efficiency (§5.5), one biLM layer against the learned mix (§5.3), and where ELMo enters
the task model (§5.2). A fraction trains for as many updates as the whole split; the full-data
ELMo run with the mix at the input serves all three comparisons, so it runs once per seed. The
runs are planned first and depend on none other, so a runner may train them side by side (the
analyze stage: one Ray task each). Each layer alone trains only once the others have shown that
the mix of all layers gains beyond the seeds' spread on all of train: where the mix gains nothing,
which layer holds the gain is no question. Each finished run's outcome can be kept
(:class:`FinishedRuns`), so an analysis stopped after hours resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from elmo_core.analysis.sampling import check_fractions, subsample
from elmo_core.tasks.readers import task_labels
from elmo_core.tasks.seeds import DEFAULT_SEEDS, Scores, difference, within_spread
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import TaskResult, TaskSplit, main_metric, train_task

DEFAULT_FRACTIONS = (0.01, 0.05, 0.1, 0.25, 1.0)
MIX = "mix"  # the per-layer comparison's learned mix of every layer
ALL_OF_TRAIN = "all of train, elmo"  # the shared full-data run, where 1.0 is not a fraction
# The heads' BiLSTM width where a task config leaves head.hidden_dim unset (the task default, 200,
# is for the best score): on held-out tasks 64 kept every verdict that stays put under the seeds,
# 2.6 times as fast (benchmarks/results/analyze_defaults-2026-11-29.md).
HIDDEN_DIM = 64
AT_INPUT_AND_OUTPUT = "ELMo at input and output"  # the placement comparison's run
INPUT, INPUT_OUTPUT = "input", "input+output"  # ELMo's placements
Progress = Callable[[str], object]


@dataclass
class TaskAnalysis:
    """One task's comparisons: ``efficiency[fraction]["elmo" | "baseline"]``, ``layers[j | mix]``,
    ``placement[input | input+output]`` and the learned mix's weights, mean over seeds;
    ``layers_not_run`` says why ``layers`` holds only the mix, where it does."""

    task: str
    metric: str  # e.g. "test_accuracy"
    efficiency: dict[float, dict[str, Scores]] = field(default_factory=dict)
    layers: dict[str, Scores] = field(default_factory=dict)
    placement: dict[str, Scores] = field(default_factory=dict)
    mix_weights: list[float] = field(default_factory=list)
    layers_not_run: str | None = None


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


@dataclass(frozen=True)
class PlannedRun:
    """One task model an analysis trains: its config (run length, head), the examples of the
    training split it trains on (None: all of them), which input, its seed, and ``what``
    comparison it serves. Independent of every other run, so runs may go side by side."""

    task: TaskConfig
    examples: tuple[int, ...] | None
    use_elmo: bool
    seed: int
    what: str

    @property
    def key(self) -> str:
        """The run's name in :class:`FinishedRuns`: its config, the size of its part of the
        training split, which input, which seed and which comparison."""
        run = {"task": self.task.model_dump(mode="json"), "elmo": self.use_elmo}
        run |= {"examples": len(self.examples) if self.examples is not None else None}
        run |= {"seed": self.seed, "what": self.what}
        return hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()[:32]


# Takes planned runs, yields (index, outcome) of each as it finishes, in any order.
Runner = Callable[[Sequence[PlannedRun]], Iterator[tuple[int, RunOutcome]]]


def train_run(
    run: PlannedRun, splits: Mapping[str, TaskSplit], device: str | torch.device = "cpu"
) -> RunOutcome:
    """Train one planned run on ``splits`` (train, and dev/test) and keep what the analysis
    reads of it."""
    train = splits["train"]
    if run.examples is not None:
        train = train.subset(run.examples)
    result = train_task(
        run.task,
        train,
        splits.get("dev"),
        splits.get("test"),
        run.use_elmo,
        seed=run.seed,
        device=device,
    )
    return RunOutcome.of(result)


def serial_runner(splits: Mapping[str, TaskSplit], device: str | torch.device = "cpu") -> Runner:
    """Runs one after another in this process."""

    def run_all(runs: Sequence[PlannedRun]) -> Iterator[tuple[int, RunOutcome]]:
        for index, run in enumerate(runs):
            yield index, train_run(run, splits, device)

    return run_all


def analyze_task(
    task: TaskConfig,
    splits: Mapping[str, TaskSplit],
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    finished: FinishedRuns | None = None,
    runner: Runner | None = None,
    numbering: tuple[int, int] | None = None,
    every_layer: bool = False,
) -> TaskAnalysis:
    """Every run of the three comparisons for ``task`` (``splits``: train, and dev/test); a run
    whose outcome ``finished`` holds is not trained again. ``runner`` trains the others (default:
    one after another in this process, on ``device``), the layers alone after the rest, and only
    where :func:`layers_not_run` finds no reason to leave them (``every_layer``: always).
    ``numbering`` (runs before this task's, runs in all) numbers the progress lines within a whole
    analysis of several tasks."""
    train = splits["train"]
    if train.activations is None:
        raise ValueError("the analysis needs the cached activations of the training split")
    num_layers = train.activations.num_layers
    check_fractions(list(train.dataset.examples), fractions, task.name)
    split = "test" if "test" in splits else "dev"
    analysis = TaskAnalysis(task.name, f"{split}_{main_metric(task)}")
    plan, layer_runs = plan_runs(task, train, fractions, seeds, num_layers)
    numbering = numbering or (0, len(plan) + len(layer_runs))
    outcomes = _Outcomes(task.name, split, progress, finished, numbering)
    runner = runner or serial_runner(splits, device)
    outcomes.train(plan, runner)
    score = outcomes.score
    for fraction in sorted(fractions):
        analysis.efficiency[fraction] = {
            name: Scores(tuple(score((_part(fraction, name), seed)) for seed in seeds))
            for name in ("elmo", "baseline")
        }
    analysis.layers_not_run = None if every_layer else layers_not_run(analysis.efficiency)
    if analysis.layers_not_run is None:
        outcomes.train(layer_runs, runner)
    else:
        outcomes.skip(layer_runs, analysis.layers_not_run)
    shared = _part(1.0, "elmo") if 1.0 in fractions else ALL_OF_TRAIN
    full = {seed: outcomes.get((shared, seed)) for seed in seeds}
    analysis.layers[MIX] = analysis.placement[INPUT] = Scores(
        tuple(outcomes.score_of(full[seed]) for seed in seeds)
    )
    analysis.mix_weights = _mean_weights([full[seed].mix_weights or [] for seed in seeds])
    for layer in range(num_layers if analysis.layers_not_run is None else 0):
        alone = _alone(layer)
        analysis.layers[str(layer)] = Scores(tuple(score((alone, seed)) for seed in seeds))
    both = Scores(tuple(score((AT_INPUT_AND_OUTPUT, seed)) for seed in seeds))
    analysis.placement[INPUT_OUTPUT] = both
    return analysis


def layers_not_run(efficiency: Mapping[float, Mapping[str, Scores]]) -> str | None:
    """Why the layers alone need not train: the mix of all layers on all of train gained, either
    way, no more than the seeds' spread. None (train them) where it did, or where no score of
    all of train or no spread judges it (1 not among the fractions, one seed)."""
    if 1.0 not in efficiency:
        return None
    elmo, baseline = efficiency[1.0]["elmo"], efficiency[1.0]["baseline"]
    if not within_spread(elmo, baseline):
        return None
    return f"the mix on all of train: {difference(elmo, baseline)}"


def plan_runs(
    task: TaskConfig,
    train: TaskSplit,
    fractions: Sequence[float],
    seeds: Sequence[int],
    num_layers: int,
) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """The runs of the three comparisons: each fraction's ELMo and baseline runs per seed, the
    shared full-data ELMo run where 1.0 is not a fraction, ELMo at input and output; then, apart,
    each layer alone (one after another they are reported in this order; side by side, as they
    finish), their heads :func:`head_width` wide."""
    update = {"elmo_at_output": False, "elmo_layers": None, "hidden_dim": head_width(task)}
    head = task.head.model_copy(update=update)
    # The labels of the whole training split: a fraction may lack a rare tag that dev or test has.
    labels = task_labels(task, train.dataset)
    base = task.model_copy(update={"head": head, "labels": labels})
    size = len(train.dataset.examples)
    runs = []
    for fraction in sorted(fractions):
        for seed in seeds:
            part = _fraction_of(train, fraction, seed)
            budget = same_updates(base, size, len(part) if part is not None else size)
            for name, use_elmo in (("elmo", True), ("baseline", False)):
                runs.append(PlannedRun(budget, part, use_elmo, seed, _part(fraction, name)))
    if 1.0 not in fractions:  # the shared full-data run is made here
        runs += [PlannedRun(base, None, True, seed, ALL_OF_TRAIN) for seed in seeds]
    both = _with_head(base, elmo_at_output=True)
    runs += [PlannedRun(both, None, True, seed, AT_INPUT_AND_OUTPUT) for seed in seeds]
    layers = []
    for layer in range(num_layers):
        alone = _with_head(base, elmo_layers=[layer])
        layers += [PlannedRun(alone, None, True, seed, _alone(layer)) for seed in seeds]
    return runs, layers


def head_width(task: TaskConfig) -> int:
    """The width of ``task``'s heads in the analysis: its config's, where it sets one, else
    :data:`HIDDEN_DIM`."""
    return task.head.hidden_dim if "hidden_dim" in task.head.model_fields_set else HIDDEN_DIM


def _part(fraction: float, name: str) -> str:
    """A sample-efficiency run's ``what``: ``10% of train, elmo``."""
    return f"{100 * fraction:g}% of train, {name}"


def _alone(layer: int) -> str:
    return f"layer {layer} alone"


class _Outcomes:
    """The outcome of every planned run: those ``finished`` holds, then the rest as ``runner``
    trains them, each kept in ``finished`` and reported to ``progress`` as it comes (a run not
    trained at all, with why)."""

    def __init__(
        self,
        task: str,
        split: str,
        progress: Progress | None,
        finished: FinishedRuns | None,
        numbering: tuple[int, int],
    ) -> None:
        self.task, self.split = task, split
        self.progress, self.finished = progress, finished
        self.before, self.total = numbering
        self.by_run: dict[tuple[str, int], RunOutcome] = {}
        self.done, self.trained, self.started = 0, 0, time.monotonic()

    def train(self, plan: Sequence[PlannedRun], runner: Runner) -> None:
        waiting = []
        for run in plan:
            outcome = self.finished.get(run.key) if self.finished is not None else None
            if outcome is None:
                waiting.append(run)
            else:
                self._record(run, outcome, earlier=True)
        if self.trained == 0:  # the rate counts from the first run trained here
            self.started = time.monotonic()
        for index, outcome in runner(waiting):
            self.trained += 1
            if self.finished is not None:
                self.finished.put(waiting[index].key, outcome)
            self._record(waiting[index], outcome, earlier=False)

    def skip(self, plan: Sequence[PlannedRun], why: str) -> None:
        for run in plan:
            self.done += 1
            self._report(run, f"not run: {why}")

    def get(self, run: tuple[str, int]) -> RunOutcome:
        return self.by_run[run]

    def score(self, run: tuple[str, int]) -> float:
        return self.score_of(self.by_run[run])

    def score_of(self, outcome: RunOutcome) -> float:
        scores = outcome.test_metrics if self.split == "test" else outcome.dev_metrics
        return scores[outcome.metric]

    def _record(self, run: PlannedRun, outcome: RunOutcome, *, earlier: bool) -> None:
        self.by_run[(run.what, run.seed)] = outcome
        self.done += 1
        score = f"{self.split} {outcome.metric} {self.score_of(outcome):.4f}"
        self._report(run, score + (" (finished earlier)" if earlier else self._eta()))

    def _report(self, run: PlannedRun, what: str) -> None:
        if self.progress is not None:
            self.progress(
                f"{self.task}: run {self.before + self.done}/{self.total}, {run.what}, "
                f"seed {run.seed}: {what}"
            )

    def _eta(self) -> str:
        """The time the analysis' runs still to come take at this task's rate so far (the layers
        alone counted, though they may not train)."""
        left = self.total - self.before - self.done
        seconds = (time.monotonic() - self.started) / self.trained * left
        return f", ETA {datetime.timedelta(seconds=round(seconds))}" if left else ""


def _fraction_of(train: TaskSplit, fraction: float, seed: int) -> tuple[int, ...] | None:
    """The examples of ``fraction`` of train drawn with ``seed``; None for all of them."""
    if fraction == 1.0:
        return None
    return tuple(subsample(list(train.dataset.examples), fraction, seed))


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
    """How many task models :func:`analyze_task` plans: it trains them all but, where
    :func:`layers_not_run` says so, the layers alone."""
    shared = 0 if 1.0 in fractions else 1
    return len(seeds) * (2 * len(fractions) + shared + num_layers + 1)
