"""The figures of adaptation: an adapt run's learned scalar mix and confusion matrix, and the
flow's scores of every task with and without ELMo."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from elmo_core.tasks.seeds import Scores
from elmo_core.tasks.trainer import TaskResult
from pipelines.tracking.figures import metric_label, panel_grid, pyplot, score_dots, sd_note

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pipelines.adapt.stage import AdaptResult

SCORES_PANEL = (4.2, 3.6)  # inches per task of the scores figure
SCORES_COLUMNS = 3
SEEDS_AT = (-0.32, -0.12)  # where a model's seeds are drawn, left of its dot (its value is right)


def mix_figure(elmo: TaskResult, seed: int) -> Figure:
    """Bars of the softmax-normalised layer weights of each mix the model (trained with
    ``seed``) has at its best epoch, each bar labelled with its value; γ in the legend, which
    sits below the axes so it never hides a bar. The title says the kept model's epoch, since the
    run's ``mix_weight`` curves go on to the last epoch trained and end elsewhere."""
    plt = pyplot()
    mixes = [
        (name, weights, gamma)
        for name, weights, gamma in (
            ("input", elmo.mix_weights, elmo.gamma),
            ("output", elmo.output_mix_weights, elmo.output_gamma),
        )
        if weights is not None and gamma is not None
    ]
    figure, axis = plt.subplots(figsize=(6, 4), layout="constrained")
    width = 0.8 / max(len(mixes), 1)
    for index, (name, weights, gamma) in enumerate(mixes):
        positions = [layer + index * width for layer in range(len(weights))]
        bars = axis.bar(positions, weights, width=width, label=f"{name} mix (γ = {gamma:.3f})")
        axis.bar_label(bars, fmt="%.2f", padding=2)
    num_layers = len(mixes[0][1]) if mixes else 0
    axis.set_xticks([layer + (len(mixes) - 1) * width / 2 for layer in range(num_layers)])
    axis.set_xticklabels([f"layer {j}" for j in range(num_layers)])  # as the tables name them
    kept = f"the model kept: epoch {elmo.best_epoch} of {len(elmo.history)}, the best on dev"
    title = f"{elmo.task}: learned scalar mix, seed {seed}\n{kept}"
    axis.set(title=title, xlabel="layer", ylabel="weight (softmax of the mix's w)")
    axis.set_ylim(0, 1.12 * max((max(weights) for _, weights, _ in mixes), default=1.0))
    figure.legend(loc="outside lower center", ncols=max(len(mixes), 1))
    return figure


def confusion_figure(matrix: np.ndarray, labels: Sequence[str], title: str) -> Figure:
    """Counts with gold labels as rows and predictions as columns, shaded by the share of each
    gold row (its recall), so that a rare label's errors show as clearly as a frequent one's."""
    plt = pyplot()
    size = 2.5 + 0.45 * len(labels)
    figure, axis = plt.subplots(figsize=(max(size + 1, 6.0), max(size, 4.5)), layout="constrained")
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)
    image = axis.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    for (row, column), count in np.ndenumerate(matrix):
        colour = "white" if shares[row, column] > 0.5 else "black"
        axis.text(column, row, str(count), ha="center", va="center", color=colour)
    ticks = range(len(labels))
    axis.set_xticks(ticks, list(labels), rotation=45, ha="right")
    axis.set_yticks(ticks, list(labels))
    axis.set(title=title, xlabel="predicted", ylabel="gold")
    figure.colorbar(image, ax=axis, label="share of the gold label")
    return figure


def task_scores_figure(results: Sequence[AdaptResult]) -> Figure:
    """One panel per task: its score without and with ELMo, the mean ± the sample standard
    deviation over the seeds (bounded to the score's range), each seed's own score a small ring
    beside it, the gain in the title; the axis zoomed to the scores, not from 0."""
    figure, axes = panel_grid(len(results), SCORES_COLUMNS, SCORES_PANEL)
    for axis, result in zip(axes, results, strict=True):
        models = (Scores(tuple(result.baseline_scores)), Scores(tuple(result.elmo_scores)))
        seeds = [Scores((value,)) for scores in models for value in scores.values]
        score_dots(axis, ["without ELMo", "with ELMo"], models, seeds)  # every seed in view
        for position, scores in enumerate(models):
            axis.scatter(
                position + np.linspace(*SEEDS_AT, len(scores.values)), scores.values,
                s=14, facecolors="none", edgecolors="grey", zorder=3,
            )  # fmt: skip
        gain = models[1].mean - models[0].mean
        axis.set(
            title=f"{result.task}: gain {gain:+.3f}\nrings: each seed's own score",
            ylabel=metric_label(f"{result.split}_{result.metric}"),
            xlabel=f"model ({sd_note(len(result.seeds))})",
        )
    return figure
