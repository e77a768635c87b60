"""The analysis figures: each task's sample-efficiency curve, and what each layer holds.

Scores are dots with their standard deviation, not bars, so that an axis may zoom to show close
scores apart (a bar's length would then lie); baselines are reference lines named in the panel's
title, and legends sit outside the axes, where they hide nothing. Layers are named as the tables
name them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from elmo_core.analysis.task_runs import MIX, TaskAnalysis
from elmo_core.tasks.seeds import Scores
from pipelines.analyze.table import Cell, Row
from pipelines.tracking.figures import metric_label, pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANEL = (4.6, 3.6)  # inches per panel of the layers figure
COLUMNS = 2  # its panels per row


def efficiency_figure(result: TaskAnalysis) -> Figure:
    """Score against the share of training examples (log x, a tick at each share), with ELMo and
    without; bars ± the sample standard deviation over the seeds, cut at the score's 0 and 1."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    fractions = sorted(result.efficiency)
    percents = [100 * fraction for fraction in fractions]
    for name, label in (("elmo", "with ELMo"), ("baseline", "without ELMo")):
        scores = [result.efficiency[fraction][name] for fraction in fractions]
        axis.errorbar(
            percents, [s.mean for s in scores], yerr=_bounded(scores), marker="o", capsize=3,
            label=label,
        )  # fmt: skip
    axis.set_xscale("log")
    axis.set_xticks(percents, [f"{percent:g}%" for percent in percents])
    axis.minorticks_off()
    axis.set(
        title=f"{result.task}: sample efficiency (Peters et al. 2018, §5.5)",
        xlabel="share of the training examples",
        ylabel=metric_label(result.metric),
    )
    axis.grid(alpha=0.3)
    figure.legend(
        loc="outside lower center",
        ncols=2,
        title=_sd_note(result.efficiency[fractions[-1]]["elmo"]),
    )
    return figure


def layers_figure(results: Sequence[TaskAnalysis], probes: Sequence[Row]) -> Figure:
    """A grid of panels: per task the score of each layer alone and of the mix (its learned
    weights in the title), per probe its accuracy per layer against its baseline as a line."""
    plt = pyplot()
    panels = max(len(results) + len(probes), 1)
    columns = min(panels, COLUMNS)
    rows = math.ceil(panels / columns)
    figure, axes = plt.subplots(
        rows,
        columns,
        figsize=(PANEL[0] * columns, PANEL[1] * rows),
        layout="constrained",
        squeeze=False,
    )
    flat = list(axes.flat)
    for axis, result in zip(flat, results, strict=False):
        names = [k for k in result.layers if k != MIX] + [MIX]
        _dots(axis, [_layer_name(k) for k in names], [result.layers[k] for k in names])
        weights = " / ".join(f"{w:.2f}" for w in result.mix_weights)
        axis.set(
            title=f"{result.task}: each layer alone and the mix\nmix weights {weights}",
            ylabel=metric_label(result.metric),
            xlabel=f"layer ({_sd_note(result.layers[MIX])})",
        )
    for axis, row in zip(flat[len(results) :], probes, strict=False):
        layers = {name: cell for name, cell in row.cells.items() if name.startswith("layer ")}
        baselines = {name: cell for name, cell in row.cells.items() if name not in layers}
        _dots(axis, list(layers), list(layers.values()), baselines=list(baselines.values()))
        for cell in baselines.values():
            axis.axhline(cell.mean, color="grey", linestyle="--")
        named = ", ".join(f"{name} {cell.text()}" for name, cell in baselines.items())
        bars = "one seed" if not any(c.sd for c in layers.values()) else "± sd"
        axis.set(
            title=f"{row.analysis}\ndashed: {named}" if named else row.analysis,
            ylabel="accuracy",
            xlabel=f"layer ({bars})",
        )
    for axis in flat[panels if results or probes else 0 :]:
        axis.set_axis_off()
    return figure


def _dots(
    axis: Axes,
    names: list[str],
    scores: Sequence[Scores | Cell],
    baselines: Sequence[Cell] = (),
) -> None:
    """A dot at each score's mean with its bounded standard deviation (none where no score has
    one), its value written beside it, on an axis zoomed to the scores and ``baselines``."""
    means = [score.mean for score in scores]
    bars = _bounded(scores) if any(score.sd for score in scores) else None
    positions = list(range(len(names)))
    axis.errorbar(positions, means, yerr=bars, fmt="o", color="tab:blue", capsize=4, clip_on=False)
    for position, mean in zip(positions, means, strict=True):
        axis.annotate(
            f"{mean:.3f}", (position, mean), xytext=(8, 0), textcoords="offset points",
            va="center", fontsize=8,
        )  # fmt: skip
    axis.set_xticks(positions, names)
    axis.set_xlim(-0.5, len(names) - 0.3)  # room for the last value on its right
    axis.grid(axis="y", alpha=0.3)
    _zoom(axis, [*scores, *baselines])


def _zoom(axis: Axes, scores: Sequence[Scores | Cell]) -> None:
    """The y-axis around the scores and their standard deviations (not from 0), within [0, 1]."""
    low = min(score.mean - score.sd for score in scores)
    high = max(score.mean + score.sd for score in scores)
    margin = max(0.02, 0.25 * (high - low))
    axis.set_ylim(max(0.0, low - margin), min(1.0, high + margin))


def _bounded(scores: Sequence[Scores | Cell]) -> list[list[float]]:
    """± the standard deviation, cut where it would cross 0 or 1 (a score's range)."""
    lower = [min(score.sd, score.mean) for score in scores]
    upper = [min(score.sd, 1.0 - score.mean) for score in scores]
    return [lower, upper]


def _sd_note(scores: Scores) -> str:
    seeds = len(scores.values)
    return (
        f"error bars: ± sample std over {seeds} seeds" if seeds > 1 else "one seed: no error bars"
    )


def _layer_name(key: str) -> str:
    """``0`` → ``layer 0`` (as the tables name layers), the mix as is."""
    return f"layer {key}" if key.isdigit() else key
