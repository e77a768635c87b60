"""How every figure logged to MLflow is drawn: matplotlib on Agg (Ray workers have no display),
imported on first use, axes labelled in words rather than metric names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

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


def log_figure(figure: Figure, artifact_file: str) -> None:
    """Log ``figure`` into the active run at :data:`DPI` and free it (pyplot keeps every open
    figure)."""
    mlflow.log_figure(figure, artifact_file, save_kwargs={"dpi": DPI, "bbox_inches": "tight"})
    pyplot().close(figure)


def metric_label(name: str) -> str:
    """A metric's name in words for an axis: ``test_f1`` → ``test F1``."""
    return " ".join(WORDS.get(part, part) for part in name.split("_"))


def plain_log_axis(axis: Axes, which: str = "y") -> None:
    """A log scale whose ticks read as plain numbers (``260``, not ``2.6×10²``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    scale = axis.yaxis if which == "y" else axis.xaxis
    (axis.set_yscale if which == "y" else axis.set_xscale)("log")
    scale.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
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
