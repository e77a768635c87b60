"""Every figure the platform logs, opened as the PNG it is: a size fit for a paper, a title, axes
labelled in words (no metric names), ticks where the points are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from elmo_core.analysis.task_runs import MIX, TaskAnalysis
from elmo_core.tasks.seeds import Scores
from elmo_core.tasks.trainer import TaskResult
from pipelines.adapt.figures import confusion_figure, mix_figure, task_scores_figure
from pipelines.adapt.stage import AdaptResult
from pipelines.analyze.figures import efficiency_figure, layers_figure
from pipelines.analyze.table import Cell, Row
from pipelines.tracking.figures import DPI, curves_figure, pyplot

MIN_PIXELS = (1000, 600)  # wide and tall enough to read in MLflow's preview and print


def _analysis() -> TaskAnalysis:
    analysis = TaskAnalysis("docstrings", "test_accuracy")
    analysis.efficiency = {
        f: {"elmo": Scores((0.5 + f / 3, 0.52 + f / 3, 0.99)), "baseline": Scores((0.4, 0.45, 0.5))}
        for f in (0.1, 0.25, 0.5, 1.0)
    }
    analysis.layers = {
        "0": Scores((0.621, 0.62, 0.622)),
        "1": Scores((0.632, 0.63, 0.634)),
        "2": Scores((0.628, 0.62, 0.63)),
        MIX: Scores((0.64, 0.65, 0.63)),
    }
    analysis.mix_weights = [0.30, 0.37, 0.33]
    return analysis


def _probe() -> Row:
    cells = {"layer 0": Cell(0.81), "layer 1": Cell(0.86), "layer 2": Cell(0.84)}
    return Row("ner linear probe accuracy", cells | {"majority": Cell(0.62)})


def _task_result() -> TaskResult:
    from types import SimpleNamespace

    return SimpleNamespace(  # type: ignore[return-value]
        task="questions",
        best_epoch=3,
        history=[{}] * 5,  # early stopping ended it two epochs after the best
        mix_weights=[0.3, 0.37, 0.33],
        gamma=1.2,
        output_mix_weights=None,
        output_gamma=None,
    )


def _adapted(task: str, elmo: tuple[float, ...], baseline: tuple[float, ...]) -> AdaptResult:
    return AdaptResult(
        task=task, run_id="r", model_name=f"elmo-{task}", model_version=1,
        model_uri=f"models:/elmo-{task}/1", metric="f1", elmo_dev={}, elmo_test={"f1": elmo[0]},
        baseline_dev={}, baseline_test={"f1": baseline[0]}, gain={}, mix_weights=[], gamma=1.0,
        seeds=list(range(len(elmo))), elmo_scores=list(elmo), baseline_scores=list(baseline),
    )  # fmt: skip


ADAPTED = [
    _adapted("ner", (0.91, 0.93, 1.0), (0.88, 0.9, 0.89)),
    _adapted("chunks", (0.62, 0.63, 0.64), (0.6, 0.6, 0.6)),
    _adapted("questions", (0.8,), (0.7,)),
]

FIGURES = {
    "efficiency": lambda: efficiency_figure(_analysis()),
    "layers": lambda: layers_figure([_analysis(), _analysis()], [_probe()]),
    "scalar_mix": lambda: mix_figure(_task_result(), seed=0),
    "task_scores": lambda: task_scores_figure(ADAPTED),
    "confusion": lambda: confusion_figure(np.array([[5, 1], [2, 7]]), ["HUM", "LOC"], "test"),
    "validation_perplexity": lambda: curves_figure(
        {"forward": [(500, 262.0), (1000, 180.0), (1500, 151.0)], "backward": [(500, 250.0)]},
        title="validation perplexity",
        ylabel="perplexity",
        log_y=True,
    ),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_each_figure_is_a_readable_png_with_a_title_and_axes_in_words(
    name: str, tmp_path: Path
) -> None:
    figure: Figure = FIGURES[name]()
    axes = [axis for axis in figure.axes if axis.axison and axis.get_label() != "<colorbar>"]
    for axis in axes:
        assert axis.get_title(), f"{name}: a panel without a title"
        for label in (axis.get_xlabel(), axis.get_ylabel()):
            assert label and "_" not in label, f"{name}: axis label {label!r}"
    path = tmp_path / f"{name}.png"
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    pyplot().close(figure)
    with Image.open(path) as image:
        width, height = image.size
    assert width >= MIN_PIXELS[0] and height >= MIN_PIXELS[1], (width, height)
    assert width / height < 4  # not a strip


def test_shares_of_the_training_data_read_as_percentages_and_bars_stay_within_0_and_1() -> None:
    figure = efficiency_figure(_analysis())
    (axis,) = figure.axes
    assert [tick.get_text() for tick in axis.get_xticklabels()] == ["10%", "25%", "50%", "100%"]
    for line in axis.get_lines():  # the error bars' caps
        assert all(0.0 <= y <= 1.0 for y in line.get_ydata())
    assert "sample std over 3 seeds" in figure.legends[0].get_title().get_text()
    pyplot().close(figure)


def test_the_layer_panels_zoom_on_dots_name_layers_as_the_tables_and_draw_baselines_as_lines() -> (
    None
):
    figure = layers_figure([_analysis()], [_probe()])
    task, probe = figure.axes[:2]
    assert task.get_ylim()[0] > 0.5 and task.get_ylim()[1] <= 1.0  # 0.621 against 0.632 shows
    names = ["layer 0", "layer 1", "layer 2"]
    assert [tick.get_text() for tick in task.get_xticklabels()] == [*names, "mix"]
    assert [tick.get_text() for tick in probe.get_xticklabels()] == names
    assert not task.patches and not probe.patches  # dots, not bars cut off by the zoom
    assert "sample std over 3 seeds" in task.get_xlabel()
    assert any(line.get_linestyle() == "--" for line in probe.get_lines())
    assert "majority 0.620" in probe.get_title() and "one seed" in probe.get_xlabel()
    values = [text.get_text() for text in probe.texts]
    assert values == ["0.810", "0.860", "0.840"]
    # one seed: no error bars, so no zero-width caps
    assert not any(collection.get_segments() for collection in probe.collections)
    pyplot().close(figure)


def _extents(figure: Figure) -> tuple[list, list, list]:
    """Rendered boxes: each legend's, each value label's, each bar's; and each data point."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    legends = [legend.get_window_extent(renderer) for legend in figure.legends]
    marks: list = []
    points: list = []
    for axis in figure.axes:
        legends += [axis.get_legend().get_window_extent(renderer)] if axis.get_legend() else []
        marks += [text.get_window_extent(renderer) for text in axis.texts]
        marks += [patch.get_window_extent(renderer) for patch in axis.patches]
        for line in axis.get_lines():
            if len(line.get_xdata()) and line.get_linestyle() != "--":  # a baseline spans all
                xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
                points += list(axis.transData.transform(xy))
    return legends, marks, points


@pytest.mark.parametrize("name", list(FIGURES))
def test_no_legend_hides_a_bar_a_value_label_or_a_point_and_bars_start_at_0(name: str) -> None:
    figure: Figure = FIGURES[name]()
    legends, marks, points = _extents(figure)
    for legend in legends:
        assert not [mark for mark in marks if legend.overlaps(mark)], name
        assert not [p for p in points if legend.contains(*p)], name
    for axis in figure.axes:
        if axis.patches and axis.get_label() != "<colorbar>":  # bars: their length is the value
            assert axis.get_ylim()[0] == 0, name
    pyplot().close(figure)


def test_the_mix_figure_says_its_weights_are_the_kept_epochs_not_the_curves_last() -> None:
    figure = mix_figure(_task_result(), seed=0)
    title = figure.axes[0].title
    assert "the model kept: epoch 3 of 5, the best on dev" in title.get_text()
    figure.canvas.draw()
    shown = title.get_window_extent()
    assert shown.x0 >= 0 and shown.x1 <= figure.bbox.x1  # whole, not cut at the edges


def test_a_log_axis_reads_as_plain_numbers_and_ticks_sit_at_the_points() -> None:
    figure = FIGURES["validation_perplexity"]()
    (axis,) = figure.axes
    figure.canvas.draw()
    assert [tick.get_text() for tick in axis.get_xticklabels()] == ["500", "1000", "1500"]
    labels = [tick.get_text() for tick in axis.get_yticklabels() if tick.get_text()]
    assert labels and not any("10^" in label or "times" in label for label in labels)
    pyplot().close(figure)


def _ys(axis) -> list[float]:
    """Every y a point, a ring or an error bar's end of ``axis`` reaches (not reference lines)."""
    from matplotlib.collections import LineCollection, PathCollection

    ys = [y for line in axis.get_lines() if line.get_linestyle() != "--" for y in line.get_ydata()]
    for collection in axis.collections:
        if isinstance(collection, LineCollection):  # error bars
            ys += [y for segment in collection.get_segments() for _, y in segment]
        elif isinstance(collection, PathCollection):  # rings
            ys += [y for _, y in collection.get_offsets()]
    return ys


@pytest.mark.parametrize("name", ["layers", "task_scores"])
def test_score_panels_fill_their_grid_keep_bars_within_0_and_1_and_leave_room_above_the_top(
    name: str,
) -> None:
    figure: Figure = FIGURES[name]()
    panels = {"layers": 3, "task_scores": 3}[name]  # layers: two tasks and a probe
    assert len(figure.axes) == panels and all(axis.axison for axis in figure.axes)  # no blank slot
    for axis in figure.axes:
        ys = _ys(axis)
        bottom, top = axis.get_ylim()
        assert min(ys) >= 0.0 and max(ys) <= 1.0  # error bars cut at the score's range
        assert bottom < min(ys) and top > max(ys)  # room around them: a score at 1.0 is not cut
        assert all(tick <= 1.0 for tick in axis.get_yticks() if bottom <= tick <= top)
    pyplot().close(figure)


def test_the_task_scores_figure_shows_every_seed_and_the_gain() -> None:
    figure = task_scores_figure(ADAPTED)
    ner = figure.axes[0]
    from matplotlib.collections import PathCollection

    scatters = [c for c in ner.collections if isinstance(c, PathCollection)]
    rings = [y for c in scatters for _, y in c.get_offsets()]
    assert sorted(rings) == sorted([0.91, 0.93, 1.0, 0.88, 0.9, 0.89])
    assert "gain +0.057" in ner.get_title() and "over 3 seeds" in ner.get_xlabel()
    assert [t.get_text() for t in ner.get_xticklabels()] == ["without ELMo", "with ELMo"]
    assert "one seed" in figure.axes[2].get_xlabel()
    pyplot().close(figure)


def test_the_efficiency_series_sit_apart_at_each_share() -> None:
    figure = efficiency_figure(_analysis())
    (axis,) = figure.axes
    elmo, baseline = (line.get_xdata() for line in axis.get_lines() if line.get_linestyle() == "-")
    assert all(e < b for e, b in zip(elmo, baseline, strict=True))  # never at the same x
    pyplot().close(figure)


def test_a_log_axis_over_less_than_a_decade_still_has_numbers() -> None:
    figure = curves_figure(
        {"mean": [(4, 2890.0), (8, 2400.0), (12, 2120.0)]},
        title="validation perplexity",
        ylabel="perplexity",
        log_y=True,
    )
    (axis,) = figure.axes
    figure.canvas.draw()
    low, high = axis.get_ylim()
    shown = [t for t in axis.get_yticks() if low <= t <= high]
    assert len(shown) >= 2
    labels = [label.get_text() for label in axis.get_yticklabels() if label.get_text()]
    assert len(labels) >= 2
    pyplot().close(figure)


def test_a_task_whose_layers_alone_did_not_train_shows_the_mix_alone_and_says_so() -> None:
    analysis = _analysis()
    analysis.layers = {MIX: analysis.layers[MIX]}
    analysis.layers_not_run = "the mix on all of train: gain +0.0050, within (0.0158)"
    figure = layers_figure([analysis], [])
    (task,) = [axis for axis in figure.axes if axis.get_title()]
    assert [tick.get_text() for tick in task.get_xticklabels()] == ["mix"]
    assert task.get_title().startswith("docstrings: the mix, no layer alone\n")
    pyplot().close(figure)
