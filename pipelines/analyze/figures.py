"""The analysis figures: the sample-efficiency curve of each task, and what each layer holds.

Drawn with matplotlib (Agg, via :mod:`pipelines.adapt.figures`' helpers) and logged to the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from elmo_core.analysis.task_runs import MIX, TaskAnalysis
from pipelines.adapt.figures import pyplot
from pipelines.analyze.table import Row

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def efficiency_figure(result: TaskAnalysis) -> Figure:
    """Score against the fraction of training examples (log x), ELMo and baseline, ± spread."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4), layout="constrained")
    fractions = sorted(result.efficiency)
    for name, label in (("elmo", "with ELMo"), ("baseline", "without ELMo")):
        scores = [result.efficiency[f][name] for f in fractions]
        axis.errorbar(
            [100 * f for f in fractions],
            [s.mean for s in scores],
            yerr=[s.spread for s in scores],
            marker="o",
            capsize=3,
            label=label,
        )
    axis.set_xscale("log")
    axis.set(
        title=f"{result.task}: sample efficiency (Peters et al. 2018, §5.5)",
        xlabel="% of training examples",
        ylabel=result.metric,
    )
    axis.legend()
    return figure


def layers_figure(results: Sequence[TaskAnalysis], probes: Sequence[Row]) -> Figure:
    """One panel per task (score per layer alone and for the mix, with the mix's learned
    weights) and one per probe row (accuracy per layer against its baseline)."""
    plt = pyplot()
    panels = len(results) + len(probes)
    figure, axes = plt.subplots(
        1, max(panels, 1), figsize=(4.5 * max(panels, 1), 4), layout="constrained", squeeze=False
    )
    for axis, result in zip(axes[0], results, strict=False):
        names = [k for k in result.layers if k != MIX] + [MIX]
        scores = [result.layers[k] for k in names]
        bars = axis.bar(names, [s.mean for s in scores], yerr=[s.spread for s in scores])
        axis.bar_label(bars, fmt="%.3f", padding=2)
        weights = ", ".join(f"{w:.2f}" for w in result.mix_weights)
        over = (
            f"mean over {len(result.layers[MIX].values)} seeds, "
            if len(result.layers[MIX].values) > 1
            else ""
        )
        title = f"{result.task}\nmix weights {weights} ({over}all of train)"
        axis.set(title=title, ylabel=result.metric)
    for axis, row in zip(axes[0][len(results) :], probes, strict=False):
        names = list(row.cells)
        bars = axis.bar(names, [row.cells[n].mean for n in names])
        axis.bar_label(bars, fmt="%.3f", padding=2)
        axis.set(title=row.analysis, ylabel="accuracy")
    return figure
