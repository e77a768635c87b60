"""The analyze stage's runner: an analysis's runs as Ray tasks give what they give one by one."""

from __future__ import annotations

import pytest

from elmo_core.analysis.task_runs import analyze_task, serial_runner
from pipelines.analyze.runner import ray_runner

pytestmark = pytest.mark.integration


def test_runs_side_by_side_on_ray_give_the_scores_of_runs_one_by_one(
    ray_session, toy_analysis
) -> None:
    """Each run's outcome in the order it finished, every planned run once, and the same scores
    as the runs trained in this process (up to float rounding of another thread count)."""
    task, splits = toy_analysis()
    fractions, seeds = (0.5, 1.0), (0, 1)
    lines: list[str] = []
    on_ray = analyze_task(
        task, splits, fractions=fractions, seeds=seeds, progress=lines.append,
        runner=ray_runner(splits),
    )  # fmt: skip
    here = analyze_task(
        task, splits, fractions=fractions, seeds=seeds, runner=serial_runner(splits)
    )
    assert len(lines) == 16 and lines[-1].startswith("toy: run 16/16")
    assert len({line.split(", ", 1)[1].split(":")[0] for line in lines}) == 16  # each run once
    for got, expected in ((on_ray.efficiency, here.efficiency), (on_ray.layers, here.layers)):
        assert got.keys() == expected.keys()
        for name in got:
            values = got[name] if isinstance(got[name], dict) else {"": got[name]}
            wanted = expected[name] if isinstance(expected[name], dict) else {"": expected[name]}
            for model in values:
                assert values[model].values == pytest.approx(wanted[model].values, abs=1e-3)
