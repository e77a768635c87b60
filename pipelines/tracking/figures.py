"""How every figure logged to MLflow is drawn: matplotlib on Agg (Ray workers have no display),
imported on first use, axes labelled in words rather than metric names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import mlflow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 200  # a 6.4-inch figure is 1280 pixels wide
FEW_POINTS = 12  # up to this many distinct x values, each is a tick
WORDS = {"f1": "F1", "accuracy": "accuracy", "test": "test", "dev": "dev"}


def pyplot() -> ModuleType:
    """matplotlib's pyplot, Agg backend, imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Spread(Protocol):
    """A score over seeds: its mean and sample standard deviation."""

    @property
    def mean(self) -> float: ...
    @property
    def sd(self) -> float: ...


def log_figure(figure: Figure, artifact_file: str, run_id: str | None = None) -> None:
    """Log ``figure`` into ``run_id`` (the active run by default) at :data:`DPI` and free it
    (pyplot keeps every open figure)."""
    save = {"dpi": DPI, "bbox_inches": "tight"}
    if run_id is None:
        mlflow.log_figure(figure, artifact_file, save_kwargs=save)
    else:
        mlflow.MlflowClient().log_figure(run_id, figure, artifact_file, save_kwargs=save)
    pyplot().close(figure)


def panel_grid(panels: int, columns: int, size: tuple[float, float]) -> tuple[Figure, list[Axes]]:
    """``panels`` panels of ``size`` inches, ``columns`` to a row, a short last row centred: no
    empty slot."""
    plt = pyplot()
    columns = max(1, min(panels, columns))
    rows = max(1, math.ceil(panels / columns))
    figure = plt.figure(figsize=(size[0] * columns, size[1] * rows), layout="constrained")
    grid = figure.add_gridspec(rows, 2 * columns)  # half-slots: a short row starts mid-slot
    axes = []
    for index in range(panels):
        row, column = divmod(index, columns)
        in_row = min(columns, panels - row * columns)
        start = 2 * column + (columns - in_row)
        axes.append(figure.add_subplot(grid[row, start : start + 2]))
    return figure, axes


def score_dots(
    axis: Axes,
    names: Sequence[str],
    scores: Sequence[Spread],
    references: Sequence[Spread] = (),
) -> None:
    """A dot at each score's mean with its bounded standard deviation (none where no score has
    one), its value written beside it, on an axis zoomed to the scores and ``references``."""
    means = [score.mean for score in scores]
    bars = bounded_sd(scores) if any(score.sd for score in scores) else None
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
    zoom_scores(axis, [*scores, *references])


def zoom_scores(axis: Axes, scores: Sequence[Spread]) -> None:
    """The y-axis around the scores and their bounded standard deviations (not from 0), with
    room above the top one for its dot and value even at 1; ticks only within [0, 1]."""
    low = min(max(0.0, score.mean - score.sd) for score in scores)
    high = max(min(1.0, score.mean + score.sd) for score in scores)
    margin = max(0.02, 0.25 * (high - low))
    bottom, top = max(0.0, low - margin), high + margin
    axis.set_ylim(bottom, top)
    axis.set_yticks([tick for tick in axis.get_yticks() if bottom <= tick <= min(top, 1.0)])


def bounded_sd(scores: Sequence[Spread]) -> list[list[float]]:
    """± the standard deviation as error bars, cut where they would cross 0 or 1 (a score's
    range)."""
    lower = [min(score.sd, score.mean) for score in scores]
    upper = [min(score.sd, 1.0 - score.mean) for score in scores]
    return [lower, upper]


def sd_note(seeds: int) -> str:
    """What the error bars are, over ``seeds`` seeds."""
    if seeds > 1:
        return f"error bars: ± sample std over {seeds} seeds"
    return "one seed: no error bars"


def metric_label(name: str) -> str:
    """A metric's name in words for an axis: ``test_f1`` → ``test F1``."""
    return " ".join(WORDS.get(part, part) for part in name.split("_"))


def plain_log_axis(axis: Axes, which: str = "y") -> None:
    """A log scale whose ticks read as plain numbers (``260``, not ``2.6×10²``), at 1, 2 and 5
    times each power of ten; evenly spaced ones where the data spans too little for two of those
    (perplexities from 2,100 to 2,900 would otherwise show no number at all). Call it once the
    data is drawn."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

    scale = axis.yaxis if which == "y" else axis.xaxis
    (axis.set_yscale if which == "y" else axis.set_xscale)("log")
    low, high = sorted(axis.get_ylim() if which == "y" else axis.get_xlim())
    decades = LogLocator(subs=(1.0, 2.0, 5.0))
    within = [tick for tick in decades.tick_values(low, high) if low <= tick <= high]
    scale.set_major_locator(decades if len(within) >= 2 else MaxNLocator(nbins=5))
    scale.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    scale.set_minor_formatter(FuncFormatter(lambda *_: ""))


def ticks_at_points(axis: Axes, xs: Sequence[float]) -> None:
    """A tick at each x where there are few of them, else whole-number ticks (x counts steps or
    epochs): never a tick at 1.25 epochs, nor 450 for points at 500, 1000 and 1500."""
    from matplotlib.ticker import MaxNLocator

    distinct = sorted(set(xs))
    if 0 < len(distinct) <= FEW_POINTS:
        axis.set_xticks(distinct, [f"{x:g}" for x in distinct])
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def curves_figure(
    curves: Mapping[str, Sequence[tuple[int, float]]],
    *,
    title: str,
    ylabel: str,
    xlabel: str = "step",
    log_y: bool = False,
) -> Figure:
    """Named ``(x, value)`` curves on one axis."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4), layout="constrained")
    xs: list[float] = []
    for name, points in curves.items():
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(steps, values, label=name, marker="." if len(points) < 50 else None)
            xs += steps
    axis.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ticks_at_points(axis, xs)
    if log_y:
        plain_log_axis(axis)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:  # below the axes, where it hides no curve
        figure.legend(loc="outside lower center", ncols=min(len(curves), 4))
    return figure


def log_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]], artifact_file: str, **labels: Any
) -> None:
    """:func:`curves_figure` logged as ``artifact_file``."""
    log_figure(curves_figure(curves, **labels), artifact_file)
