"""analyze_task: every comparison's runs, over seeds, on activations made up for the test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elmo_core.analysis import task_runs
from elmo_core.analysis.task_runs import (
    HIDDEN_DIM,
    INPUT,
    INPUT_OUTPUT,
    MIX,
    FinishedRuns,
    analyze_task,
    layers_not_run,
    plan_runs,
    same_updates,
)
from elmo_core.tasks.seeds import Scores
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.trainer import TaskResult, TaskSplit

ToyAnalysis = Callable[[], tuple[TaskConfig, dict[str, TaskSplit]]]  # the toy_analysis fixture


def test_every_comparison_runs_over_the_seeds_and_the_full_data_run_is_shared(
    monkeypatch: pytest.MonkeyPatch,
    toy_analysis: ToyAnalysis,
) -> None:
    task, splits = toy_analysis()  # a toy whose mix gains nothing: the layers alone made to train
    monkeypatch.setattr(task_runs, "layers_not_run", lambda efficiency: None)
    lines: list[str] = []
    result = analyze_task(task, splits, fractions=(0.5, 1.0), seeds=(0, 1), progress=lines.append)
    assert result.metric == "dev_accuracy"
    assert sorted(result.efficiency) == [0.5, 1.0]
    assert all(len(s.values) == 2 for f in result.efficiency.values() for s in f.values())
    assert list(result.layers) == [MIX, "0", "1", "2"]
    assert result.layers[MIX] == result.efficiency[1.0]["elmo"] == result.placement[INPUT]
    assert set(result.placement) == {INPUT, INPUT_OUTPUT}
    assert sum(result.mix_weights) == pytest.approx(1.0) and len(result.mix_weights) == 3
    # 2 seeds × (2 fractions × 2 models + input and output + 3 layers alone, these last)
    assert len(lines) == 2 * (4 + 1 + 3) and lines[-1].startswith("toy: run 16/16")
    assert lines[0].startswith("toy: run 1/16, 50% of train, elmo, seed 0: dev accuracy ")
    assert [" layer " in line for line in lines] == [False] * 10 + [True] * 6


def test_the_layers_alone_do_not_train_where_the_mix_gains_nothing_on_all_of_train(
    monkeypatch: pytest.MonkeyPatch,
    toy_analysis: ToyAnalysis,
) -> None:
    task, splits = toy_analysis()
    seen: list[dict[float, dict[str, Scores]]] = []

    def nothing(efficiency: dict[float, dict[str, Scores]]) -> str:
        seen.append(efficiency)
        return "the mix on all of train: gain +0.0010, within (0.0100)"

    monkeypatch.setattr(task_runs, "layers_not_run", nothing)
    lines: list[str] = []
    result = analyze_task(task, splits, fractions=(0.5, 1.0), seeds=(0, 1), progress=lines.append)
    assert seen == [result.efficiency]  # decided on the trained efficiency runs
    assert list(result.layers) == [MIX] and result.layers_not_run == nothing({})
    assert len(lines) == 16 and lines[-1].startswith("toy: run 16/16, layer 2 alone, seed 1: ")
    assert lines[-1].endswith("not run: the mix on all of train: gain +0.0010, within (0.0100)")
    assert sum(" not run: " in line for line in lines) == 6


def _scores(*values: float) -> Scores:
    return Scores(values)


@pytest.mark.parametrize(
    ("elmo", "baseline", "skipped"),
    [
        ((0.80, 0.82, 0.81), (0.80, 0.79, 0.81), True),  # +0.01 within its sd (0.014)
        ((0.80, 0.79, 0.81), (0.80, 0.82, 0.81), True),  # a loss within its sd
        ((0.90, 0.91, 0.92), (0.80, 0.81, 0.82), False),  # +0.10, far beyond
        ((0.70, 0.71, 0.72), (0.80, 0.81, 0.82), False),  # a loss beyond: which layer hurts?
        ((0.90,), (0.80,), False),  # one seed: no spread to judge by
        ((1.0, 1.0), (1.0, 1.0), True),  # saturated: every seed the same, no gain
        ((1.0, 1.0), (0.9, 0.9), False),  # every seed the same, a gain
    ],
)
def test_the_layers_alone_are_left_only_where_the_gain_on_all_of_train_is_within_its_sd(
    elmo: tuple[float, ...], baseline: tuple[float, ...], skipped: bool
) -> None:
    efficiency = {0.1: {"elmo": _scores(0.5, 0.6), "baseline": _scores(0.1, 0.2)}}
    efficiency[1.0] = {"elmo": _scores(*elmo), "baseline": _scores(*baseline)}
    why = layers_not_run(efficiency)
    assert (why is not None) == skipped
    if why is not None:
        assert why.startswith("the mix on all of train: gain ")
    assert layers_not_run({0.1: efficiency[0.1]}) is None  # no score of all of train


def test_a_task_numbers_its_runs_within_the_whole_analysis(toy_analysis: ToyAnalysis) -> None:
    """The second of three tasks of 16 runs each: its runs are 17 to 32 of 48."""
    task, splits = toy_analysis()
    lines: list[str] = []
    analyze_task(
        task, splits, fractions=(0.5, 1.0), seeds=(0, 1), progress=lines.append,
        numbering=(16, 48),
    )  # fmt: skip
    assert lines[0].startswith("toy: run 17/48, ") and lines[-1].startswith("toy: run 32/48, ")


def test_a_fraction_trains_for_as_many_updates_as_the_whole_split_and_scores_dev_as_often() -> None:
    task = TaskConfig(name="toy", type="tagging", format="conllu", train=Path("unused"))
    assert same_updates(task, full=100, part=25).training.epochs == 4 * task.training.epochs
    assert same_updates(task, full=100, part=30).training.epochs == 34  # ceil(10 · 100 / 30)
    assert same_updates(task, full=100, part=100) == task
    # dev scored as often as over the whole split: once per ceil(100 / 32) updates
    assert same_updates(task, full=100, part=25).training.eval_every == 4


def test_an_analysis_stopped_midway_resumes_with_the_runs_it_finished(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    toy_analysis: ToyAnalysis,
) -> None:
    task, splits = toy_analysis()
    fractions, seeds = (0.5, 1.0), (0,)  # 8 runs; one seed, so the layers alone train too
    straight = analyze_task(task, splits, fractions=fractions, seeds=seeds)
    trained: list[str] = []
    train_task = task_runs.train_task

    def counted(task: TaskConfig, *args: Any, **kwargs: Any) -> TaskResult:
        trained.append(task.name)
        return train_task(task, *args, **kwargs)

    def stop_after_three(line: str) -> None:
        if line.startswith("toy: run 3/"):
            raise KeyboardInterrupt

    monkeypatch.setattr(task_runs, "train_task", counted)
    finished = FinishedRuns(tmp_path / "runs")
    with pytest.raises(KeyboardInterrupt):
        analyze_task(
            task,
            splits,
            fractions=fractions,
            seeds=seeds,
            progress=stop_after_three,
            finished=finished,
        )
    assert len(trained) == 3 and len(list(finished.directory.glob("*.json"))) == 3

    lines: list[str] = []
    resumed = analyze_task(
        task, splits, fractions=fractions, seeds=seeds, progress=lines.append, finished=finished
    )
    assert len(trained) == 8  # the 3 finished runs, then the 5 the stop left
    assert [line.endswith(" (finished earlier)") for line in lines] == [True] * 3 + [False] * 5
    assert resumed == straight
    assert not list(finished.directory.glob(".*"))  # no half-written outcome


def test_heads_are_the_analysis_width_unless_the_task_config_sets_one(
    toy_analysis: ToyAnalysis,
) -> None:
    task, splits = toy_analysis()  # its config sets hidden_dim 4
    unset = task.model_copy(update={"head": task.head.model_validate({"dropout": 0.0})})
    for config, width in ((task, 4), (unset, HIDDEN_DIM)):
        layers_in = splits["train"].activations.num_layers  # type: ignore[union-attr]
        runs, layers = plan_runs(config, splits["train"], (0.5, 1.0), (0,), layers_in)
        assert {run.task.head.hidden_dim for run in runs + layers} == {width}
