"""A training run's progress in one wording: rank 0's console lines and the flow's, said from the
values read back from a real MLflow store, with one ETA."""

from __future__ import annotations

import math
import re
import socket
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from pydantic import BaseModel

from elmo_core.model.bilm import BiLM
from elmo_core.perplexity import PerplexitySums
from elmo_core.presets import tiny
from pipelines.tracking import flow_runs, stage_runs
from pipelines.tracking.train_progress import (
    ETA_WINDOWS,
    TRAIN_STARTED_TAG,
    StepProgress,
    ValidationProgress,
    eta_seconds,
    started_mark,
    started_tag,
    training_progress,
)
from pipelines.train.checkpoint import SharedState
from pipelines.train.progress import Progress, TrackedRun


class _Params(BaseModel):
    name: str


def test_the_eta_is_the_rate_of_the_last_windows_since_the_loop_began() -> None:
    started = started_tag(100, 1_000.0)  # resumed at step 100; start-up before that not counted
    assert started == "step 100 at 1970-01-01 00:16:40.000 UTC"  # a time a person reads
    marks = [started_mark(started), (200, 1_050.0)]
    assert eta_seconds(1_100, marks) == pytest.approx(450.0)  # 2 steps/s
    assert math.isnan(eta_seconds(1_100, marks[:1]))  # no step yet: no rate
    assert math.isnan(eta_seconds(None, marks))  # no total: no ETA
    # The rate is the last ETA_WINDOWS windows': a run that slowed to 1 step/s says so.
    slowed = [*marks, *[(200 + 100 * k, 1_050.0 + 100 * k) for k in range(1, ETA_WINDOWS + 1)]]
    assert eta_seconds(1_100, slowed) == pytest.approx(1_100 - 700)


def _sums(forward: float, backward: float, trapped: int) -> PerplexitySums:
    tokens = 100
    nll = (tokens * math.log(forward), tokens * math.log(backward))
    return PerplexitySums(*nll, tokens, tokens, trapped, 0, 128)


def test_the_flow_reads_back_each_line_rank_0_printed_in_the_same_words(
    store: MlflowClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = _Params(name="x")
    with flow_runs.parent_run("pretrain", "p", "flow-7", params) as parent:
        assert training_progress(parent) is None  # no training run yet
        run = _train_run(store, "train-bilm-7", parent)
        store.set_tag(run.info.run_id, flow_runs.TOTAL_STEPS_TAG, "8")
        before = training_progress(parent)
        progress = _progress(run, tmp_path, total_steps=8, log_every=2)
        best = BiLM(tiny(), vocab_size=100)  # what the worker hands over when it improved
        with progress.tracking():
            for step in range(1, 9):
                progress.after_step(step, _output(5.0 - step / 4), _norm(), 1)
                if step % 4 == 0:
                    sums = _sums(90.0, 80.0, 3 * (step == 8))  # the same: best only at step 4
                    progress.after_validation(step, sums, best if step == 4 else None)
        everything = training_progress(parent)
        later = training_progress(parent, since=6)
    printed = [
        line.removeprefix("[train] ")
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("[train] step")
    ]
    assert before is not None and (before.step, before.total, before.events) == (0, 8, [])
    assert everything is not None and everything.step == 8
    assert [event.line() for event in everything.events] == [
        # the flow does not know the rows validated, only those that locked up
        line.replace("3 of 128 rows", "3 rows")
        for line in printed
    ]
    assert [(e.step, int(isinstance(e, ValidationProgress))) for e in everything.events] == [
        (2, 0), (4, 0), (4, 1), (6, 0), (8, 0), (8, 1)
    ]  # fmt: skip
    steps = [e.line() for e in everything.events if isinstance(e, StepProgress)]
    # every step line ends in a known ETA (not "?"), whatever the machine's speed made it
    assert all(re.search(r"  ETA \d+:\d\d:\d\d$", line) for line in steps), steps
    assert later is not None and [event.step for event in later.events] == [6, 8, 8]
    assert store.get_run(run.info.run_id).data.tags[TRAIN_STARTED_TAG].startswith("step 0 at 20")


def test_the_flow_gets_each_step_and_validation_as_values_not_text(
    store: MlflowClient, tmp_path: Path
) -> None:
    with flow_runs.parent_run("pretrain", "p", "flow-9", _Params(name="y")) as parent:
        run = _train_run(store, "train-bilm-9", parent)
        store.set_tag(run.info.run_id, flow_runs.TOTAL_STEPS_TAG, "2")
        progress = _progress(run, tmp_path, total_steps=2, log_every=1, console=False)
        with progress.tracking():
            progress.after_step(1, _output(4.0), _norm(), 1)
            progress.after_validation(1, _sums(90.0, 80.0, 3), None)
        read = training_progress(parent)

    assert read is not None
    step, validation = read.events
    assert isinstance(step, StepProgress) and (step.step, step.total) == (1, 2)
    assert (step.loss, step.grad_norm) == (4.0, 1.5) and step.tokens_per_s > 0
    assert isinstance(validation, ValidationProgress) and validation.best
    assert validation.forward_perplexity == pytest.approx(90.0)
    assert validation.backward_perplexity == pytest.approx(80.0)
    assert (validation.forward_trapped, validation.backward_trapped) == (3, 0)


def test_under_a_flow_rank_0_prints_nothing_and_the_flow_logs_it(
    store: MlflowClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _train_run(store, "train-bilm-8", None)
    progress = _progress(run, tmp_path, total_steps=2, log_every=1, console=False)
    with progress.tracking():
        progress.after_step(1, _output(4.0), _norm(), 1)
    assert capsys.readouterr().out == ""
    history = store.get_metric_history(run.info.run_id, flow_runs.TRAIN_LOSS_METRIC)
    assert [point.step for point in history] == [1]


def _train_run(store: MlflowClient, name: str, parent: str | None) -> Run:
    """A train run as the driver opens it (the client's: rank 0 resumes it)."""
    stage_runs.ensure_experiment()
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    assert experiment is not None
    tags = {stage_runs.STAGE_TAG: "train"} | ({"mlflow.parentRunId": parent} if parent else {})
    return store.create_run(experiment.experiment_id, run_name=name, tags=tags)


def _progress(
    run: Run, tmp_path: Path, *, total_steps: int, log_every: int, console: bool = True
) -> Progress:
    """Rank 0's progress of a one-worker run from step 0, validating 10 sentences."""
    return Progress(
        _tracked(run, tmp_path),
        SharedState(step=0, world_size=1),
        rank=0,
        total_steps=total_steps,
        log_every=log_every,
        validation_sentences=10,
        warn_at=(1.25, 1.5),
        console=console,
    )


def _tracked(run: Run, tmp_path: Path) -> TrackedRun:
    uri = stage_runs.use_tracking()
    return TrackedRun(uri, run.info.run_name, run.info.run_id, str(tmp_path), socket.gethostname())


def _output(loss: float):
    import torch

    from elmo_core.model.bilm import LossOutput

    value = torch.tensor(loss)
    return LossOutput(value, value, torch.tensor(40.0))


def _norm():
    import torch

    return torch.tensor(1.5)
