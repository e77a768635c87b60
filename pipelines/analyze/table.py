"""The analysis as one table: rows are analyses, columns are layers or fractions, each a mean ± sd.

The same rows are printed, logged to the run, and read back by ``elmo analyze --compare``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from elmo_core.analysis.probe import ProbeResult
from elmo_core.analysis.senses import SenseProbeResult
from elmo_core.analysis.task_runs import INPUT, INPUT_OUTPUT, MIX, TaskAnalysis
from elmo_core.tasks.seeds import Scores, difference, within_spread

TABLE_FILE = "analysis.json"
Score = TypeVar("Score", Scores, "Cell")
MARKDOWN_FILE = "analysis.md"
CELLS_TABLE = "analysis_cells.json"  # an MLflow table: one row per cell
BASELINE_MARGIN = 0.05  # a probe's best layer within this of its baseline wins nothing


@dataclass(frozen=True)
class Cell:
    """A mean and its sample standard deviation over seeds (0 where one run decides it)."""

    mean: float
    sd: float = 0.0

    def text(self) -> str:
        return f"{self.mean:.3f}±{self.sd:.3f}" if self.sd else f"{self.mean:.3f}"

    @classmethod
    def of(cls, scores: Scores) -> Cell:
        return cls(scores.mean, scores.sd)


@dataclass(frozen=True)
class Row:
    """One analysis: ``cells`` by column name (a layer, a fraction, a placement); a probe's also
    its score on its own training data per layer (``train``), beside its test score."""

    analysis: str
    cells: dict[str, Cell]
    train: dict[str, Cell] = field(default_factory=dict)

    def text(self, name: str) -> str:
        """A cell as the table shows it: ``0.856`` or, a probe's, ``0.856 (train 0.870)``."""
        shown = self.cells[name].text()
        return f"{shown} (train {self.train[name].text()})" if name in self.train else shown


def task_rows(result: TaskAnalysis) -> list[Row]:
    """Sample efficiency (ELMo, baseline), per layer, mix weights, placement of one task."""
    fractions = sorted(result.efficiency)
    prefix = f"{result.task} {result.metric}"
    rows = [
        Row(
            f"{prefix}, {name} by train fraction",
            {f"{f:.0%}": Cell.of(result.efficiency[f][name]) for f in fractions},
        )
        for name in ("elmo", "baseline")
    ]
    layers = {f"layer {k}": Cell.of(v) for k, v in result.layers.items() if k != MIX}
    # where no layer alone trained, the row (named the same, for comparisons) holds the mix
    rows.append(Row(f"{prefix}, per layer", layers | {"mix": Cell.of(result.layers[MIX])}))
    weights = {f"layer {j}": Cell(w) for j, w in enumerate(result.mix_weights)}
    seeds = len(result.layers[MIX].values)
    mean = f"mean over {seeds} seeds, " if seeds > 1 else ""
    label = f"{result.task} learned mix weights ({mean}all of train, best epoch)"
    rows.append(Row(label, weights))
    placement = {name: Cell.of(result.placement[name]) for name in (INPUT, INPUT_OUTPUT)}
    rows.append(Row(f"{prefix}, ELMo placement", placement))
    return rows


def sense_row(result: SenseProbeResult) -> Row:
    cells = {f"layer {j}": Cell(a) for j, a in enumerate(result.layer_accuracies)}
    train = {f"layer {j}": Cell(a) for j, a in enumerate(result.train_accuracies)}
    name = "word sense, nearest centroid accuracy"
    return Row(name, cells | {"MFS": Cell(result.mfs_accuracy)}, train)


def probe_row(task: str, result: ProbeResult) -> Row:
    cells = {f"layer {j}": Cell(a) for j, a in enumerate(result.test_accuracy)}
    train = {f"layer {j}": Cell(a) for j, a in enumerate(result.train_accuracy)}
    majority = {"majority": Cell(result.majority_accuracy)}
    return Row(f"{task} linear probe accuracy", cells | majority, train)


def headline(results: Sequence[TaskAnalysis], probes: Sequence[Row]) -> list[str]:
    """What a reader looks for first: per task the fraction of the training data where ELMo
    gains most (the sample-efficiency point) and the single layer that does best; per probe the
    layer that wins, against the probe's own baseline; what ± means."""
    lines = []
    for result in results:
        efficiency = result.efficiency
        fraction = max(
            efficiency, key=lambda f: efficiency[f]["elmo"].mean - efficiency[f]["baseline"].mean
        )
        elmo, baseline = efficiency[fraction]["elmo"], efficiency[fraction]["baseline"]
        scores = {f"layer {name}": s for name, s in result.layers.items() if name != MIX}
        if result.layers_not_run is None:
            alone = _best_alone(scores)
        else:
            alone = f"not run ({result.layers_not_run})"
        lines.append(
            f"{result.task}: with {fraction:.0%} of its training data, {result.metric} {elmo} "
            f"with ELMo, {baseline} without ({difference(elmo, baseline)}); "
            f"each layer alone: {alone}"
        )
    for row in probes:
        lines.append(f"{row.analysis}: {_probe_verdict(row)}")
    seeds = max((len(s.values) for r in results for s in r.layers.values()), default=1)
    if seeds > 1:
        lines.append(f"(± is the sample standard deviation over the {seeds} seeds)")
    return lines


def headline_metrics(results: Sequence[TaskAnalysis], probes: Sequence[Row]) -> dict[str, float]:
    """The headline's numbers, the analyze run's only top-level metrics, each named for the score
    it holds (which fraction or layer won is the headline's, in the run's description): per task
    ELMo's gain at the fraction where it gains most and the best single layer's score, per probe
    its best layer's score."""
    metrics = {}
    for result in results:
        metrics[f"{result.task}/gain_in_{result.metric}_at_best_fraction"] = max(
            scores["elmo"].mean - scores["baseline"].mean for scores in result.efficiency.values()
        )
        layers = [scores.mean for name, scores in result.layers.items() if name != MIX]
        if layers:
            metrics[f"{result.task}/{result.metric}_of_best_single_layer"] = max(layers)
    for row in probes:
        layers = [cell.mean for name, cell in row.cells.items() if name.startswith("layer ")]
        metrics[f"{_slug(row.analysis)}_of_best_layer"] = max(layers)
    return metrics


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", text.lower()).strip("_")


def scores_text(scores: Mapping[str, Scores]) -> Callable[[str], str]:
    """A named score as text: ``0.7500 ± 0.0707``."""
    return lambda name: str(scores[name])


def _probe_verdict(row: Row) -> str:
    """The best layer against the probe's own baseline (majority tag, most frequent sense); a
    probe whose best layer is within ``BASELINE_MARGIN`` of it barely learns, says so and names
    no winner. Each layer's score on the probe's training data is shown beside its test score."""
    layers = {name: cell for name, cell in row.cells.items() if name.startswith("layer ")}
    baselines = {name: cell for name, cell in row.cells.items() if name not in layers}
    others = ", ".join(f"{name} {cell.text()}" for name, cell in baselines.items())
    top = max(layers.values(), key=lambda cell: cell.mean)
    floor = max((cell.mean for cell in baselines.values()), default=0.0)
    if top.mean - floor < BASELINE_MARGIN and top.mean < 1.0:
        best = max(layers, key=lambda name: layers[name].mean)
        return (
            f"no layer clears its baseline by {BASELINE_MARGIN * 100:.0f} points, so none wins "
            f"(best {row.text(best)}; {others}): the probe barely learns"
        )
    return _winner(layers, row.text, others)


def _best_alone(scores: Mapping[str, Scores]) -> str:
    """:func:`_winner` of the layers alone, unless another layer scores within the seeds' spread of
    the best (the standard deviation of their difference): then none is beyond the others, and the
    line says which are close."""
    winner = _winner(scores, scores_text(scores))
    top = max(scores, key=lambda name: scores[name].mean)
    close = [name for name in scores if name != top and within_spread(scores[top], scores[name])]
    if not close or winner.startswith("saturated"):
        return winner
    near = ", ".join(f"{name} {scores[name]}" for name in close)
    return f"none beyond the seeds' spread: {top} {scores[top]}, within it {near}"


def _winner(scores: Mapping[str, Score], shown: Callable[[str], str], others: str = "") -> str:
    """``best layer 1 (0.750; majority 0.600)``, ``best layer 0 and layer 2 (…)`` when they tie
    on the mean, or ``saturated: every layer scores 1.000 on every seed (majority 0.600)`` where
    all score perfectly and nothing tells them apart; ``shown(name)``: a score as text."""
    top = max(score.mean for score in scores.values())
    best = [name for name, score in scores.items() if score.mean == top]
    if len(best) == len(scores) > 1 and top >= 1.0:
        return f"saturated: every layer scores {shown(best[0])} on every seed" + (
            f" ({others})" if others else ""
        )
    return f"best {' and '.join(best)} ({shown(best[0])}{'; ' + others if others else ''})"


def format_rows(rows: Sequence[Row]) -> str:
    """A plain-text table; each row lists its own columns (fractions and layers differ)."""
    width = max((len(row.analysis) for row in rows), default=0)
    lines = []
    for row in rows:
        cells = "  ".join(f"{name} {row.text(name)}" for name in row.cells)
        lines.append(f"{row.analysis:<{width}}  {cells}")
    return "\n".join(lines)


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| analysis | results |", "|---|---|"]
    for row in rows:
        cells = ", ".join(f"{name}: {row.text(name)}" for name in row.cells)
        lines.append(f"| {row.analysis} | {cells} |")
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[Row]) -> str:
    return json.dumps([asdict(row) for row in rows], indent=1)


def from_json(text: str) -> list[Row]:
    return [
        Row(
            row["analysis"],
            {name: Cell(**cell) for name, cell in row["cells"].items()},
            {name: Cell(**cell) for name, cell in row.get("train", {}).items()},
        )
        for row in json.loads(text)
    ]


def compare_rows(first: Sequence[Row], second: Sequence[Row], names: tuple[str, str]) -> str:
    """Two analyses side by side, cell by cell: ``A → B`` for each analysis both hold."""
    by_name = {row.analysis: row for row in second}
    width = max((len(row.analysis) for row in first), default=0)
    lines = [f"{'analysis':<{width}}  {names[0]} → {names[1]}"]
    for row in first:
        other = by_name.get(row.analysis)
        if other is None:
            lines.append(f"{row.analysis:<{width}}  (only in {names[0]})")
            continue
        cells = "  ".join(
            f"{name} {cell.text()}→{other.cells[name].text()}"
            for name, cell in row.cells.items()
            if name in other.cells
        )
        lines.append(f"{row.analysis:<{width}}  {cells}")
    lines += [
        f"{row.analysis:<{width}}  (only in {names[1]})"
        for row in second
        if row.analysis not in {r.analysis for r in first}
    ]
    return "\n".join(lines)
