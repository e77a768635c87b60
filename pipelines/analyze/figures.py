"""The analysis figures: each task's sample-efficiency curve, and what each layer holds.

Scores are dots with their standard deviation, not bars, so that an axis may zoom to show close
scores apart (a bar's length would then lie); baselines are reference lines named in the panel's
title, and legends sit outside the axes, where they hide nothing. Layers are named as the tables
name them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from elmo_core.analysis.task_runs import MIX, TaskAnalysis
from pipelines.analyze.table import Row
from pipelines.tracking.figures import (
    bounded_sd,
    metric_label,
    panel_grid,
    pyplot,
    score_dots,
    sd_note,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANEL = (4.6, 3.6)  # inches per panel of the layers figure
COLUMNS = 2  # its panels per row
OFFSET = 1.03  # the efficiency curves' points, apart on the log x-axis: bars never overlap


def efficiency_figure(result: TaskAnalysis) -> Figure:
    """Score against the share of training examples (log x, a tick at each share), with ELMo and
    without, each series a little apart from its share so their bars never overlap; bars ± the
    sample standard deviation over the seeds, cut at the score's 0 and 1."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    fractions = sorted(result.efficiency)
    percents = [100 * fraction for fraction in fractions]
    series = (("elmo", "with ELMo", 1 / OFFSET), ("baseline", "without ELMo", OFFSET))
    for name, label, shift in series:
        scores = [result.efficiency[fraction][name] for fraction in fractions]
        axis.errorbar(
            [shift * percent for percent in percents], [s.mean for s in scores],
            yerr=bounded_sd(scores), marker="o", capsize=3, label=label,
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
        title=sd_note(len(result.efficiency[fractions[-1]]["elmo"].values)),
    )
    return figure


def layers_figure(results: Sequence[TaskAnalysis], probes: Sequence[Row]) -> Figure:
    """A grid of panels: per task the score of each layer alone and of the mix (its learned
    weights in the title), per probe its accuracy per layer against its baseline as a line."""
    figure, flat = panel_grid(len(results) + len(probes), COLUMNS, PANEL)
    for axis, result in zip(flat, results, strict=False):
        names = [k for k in result.layers if k != MIX] + [MIX]
        score_dots(axis, [_layer_name(k) for k in names], [result.layers[k] for k in names])
        weights = " / ".join(f"{w:.2f}" for w in result.mix_weights)
        shown = "each layer alone and the mix"
        if result.layers_not_run is not None:  # the mix gained nothing, so no layer alone ran
            shown = "the mix, no layer alone"
        axis.set(
            title=f"{result.task}: {shown}\nmix weights {weights}",
            ylabel=metric_label(result.metric),
            xlabel=f"layer ({sd_note(len(result.layers[MIX].values))})",
        )
    for axis, row in zip(flat[len(results) :], probes, strict=False):
        layers = {name: cell for name, cell in row.cells.items() if name.startswith("layer ")}
        baselines = {name: cell for name, cell in row.cells.items() if name not in layers}
        score_dots(axis, list(layers), list(layers.values()), list(baselines.values()))
        for cell in baselines.values():
            axis.axhline(cell.mean, color="grey", linestyle="--")
        named = ", ".join(f"{name} {cell.text()}" for name, cell in baselines.items())
        bars = "one seed" if not any(c.sd for c in layers.values()) else "± sd"
        axis.set(
            title=f"{row.analysis}\ndashed: {named}" if named else row.analysis,
            ylabel="accuracy",
            xlabel=f"layer ({bars})",
        )
    return figure


def _layer_name(key: str) -> str:
    """``0`` → ``layer 0`` (as the tables name layers), the mix as is."""
    return f"layer {key}" if key.isdigit() else key
