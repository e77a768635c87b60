"""What rank 0 says about validation: the warning rule on the curves, and the trapped rows and the
health tag it leaves in a real MLflow store."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
from mlflow import MlflowClient

from elmo_core.config import TrainConfig
from elmo_core.perplexity import PerplexitySums
from pipelines.tracking import figures, stage_runs
from pipelines.tracking.flow_runs import HEALTH_TAG
from pipelines.tracking.train_progress import TRAPPED_ROWS
from pipelines.train.checkpoint import SharedState
from pipelines.train.progress import (
    Progress,
    TrackedRun,
    ValidationWarning,
    validation_warnings,
)

# A run that fell into the zero-state trap: its forward direction's validation perplexity rose
# at step 3000 while the sampled training loss kept falling.
TRAPPED_FORWARD = [(1000, 188.0), (2000, 136.9), (3000, 284.4)]
TRAPPED_BACKWARD = [(1000, 184.0), (2000, 142.0), (3000, 116.8)]
RISE = "forward validation perplexity 284.4 is 2.08x its best (136.9 at step 2000)"
DEFAULTS = {"rise": TrainConfig().warn_rise, "parting": TrainConfig().warn_parting}
PARTING = "forward and backward validation perplexities part: 284.4 and 116.8 (2.43x)"


def test_a_direction_past_its_best_warns_naming_its_best() -> None:
    forward = [(1000, 120.0), (2000, 100.0), (3000, 130.0)]
    backward = [(1000, 118.0), (2000, 101.0), (3000, 105.0)]
    assert validation_warnings(forward, backward, **DEFAULTS) == [
        ValidationWarning(
            "rise past best",
            3000,
            "forward validation perplexity 130.0 is 1.30x its best (100.0 at step 2000)",
        )
    ]


def test_directions_parting_warn_of_the_larger_over_the_smaller() -> None:
    expected = "forward and backward validation perplexities part: 90.0 and 150.0 (1.67x)"
    assert validation_warnings([(500, 90.0)], [(500, 150.0)], **DEFAULTS) == [
        ValidationWarning("directions parting", 500, expected)
    ]
    (swapped,) = validation_warnings([(500, 150.0)], [(500, 90.0)], **DEFAULTS)
    assert swapped.message.endswith("(1.67x)")


def test_a_healthy_history_gives_no_warning() -> None:
    assert validation_warnings(TRAPPED_FORWARD[:2], TRAPPED_BACKWARD[:2], **DEFAULTS) == []
    # A bump within the margin of its best, directions within the margin of each other.
    bumped = [*TRAPPED_FORWARD[:2], (3000, 165.0)]
    assert validation_warnings(bumped, [*TRAPPED_BACKWARD[:2], (3000, 150.0)], **DEFAULTS) == []
    assert validation_warnings([], [], **DEFAULTS) == []


def test_the_zero_state_trap_warns_of_the_rise_and_the_parting() -> None:
    assert validation_warnings(TRAPPED_FORWARD, TRAPPED_BACKWARD, **DEFAULTS) == [
        ValidationWarning("rise past best", 3000, RISE),
        ValidationWarning("directions parting", 3000, PARTING),
    ]


def test_the_margins_are_the_callers() -> None:
    kinds = [
        w.kind
        for w in validation_warnings(TRAPPED_FORWARD, TRAPPED_BACKWARD, rise=2.5, parting=1.5)
    ]
    assert kinds == ["directions parting"]
    assert validation_warnings(TRAPPED_FORWARD, TRAPPED_BACKWARD, rise=2.5, parting=2.5) == []


def _sums(forward: float, backward: float, forward_trapped: int) -> PerplexitySums:
    """Sums whose perplexities are ``forward`` and ``backward``, over 128 rows."""
    tokens = 1000
    nll = (tokens * math.log(forward), tokens * math.log(backward))
    return PerplexitySums(*nll, tokens, tokens, forward_trapped, 0, 128)


@pytest.fixture
def tracked(store: MlflowClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TrackedRun:
    """A train run in the real store, as the driver opens it for rank 0."""
    uri = stage_runs.use_tracking()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # Progress.tracking sets it for the loop
    stage_runs.ensure_experiment()
    experiment = store.get_experiment_by_name(stage_runs.EXPERIMENT)
    assert experiment is not None
    run = store.create_run(experiment.experiment_id, run_name="train-bilm-trapped")
    run_dir = str(tmp_path / "run")
    return TrackedRun(uri, "train-bilm-trapped", run.info.run_id, run_dir, socket.gethostname())


def _rank_0(tracked: TrackedRun, console: bool = True) -> Progress:
    """Rank 0's progress of a 4,000-step run at the default warning margins."""
    return Progress(
        tracked,
        SharedState(step=0, world_size=1),
        rank=0,
        total_steps=4000,
        log_every=50,
        validation_sentences=2000,
        warn_at=(DEFAULTS["rise"], DEFAULTS["parting"]),
        console=console,
    )


def test_validation_logs_trapped_rows_and_tags_the_latest_warning(
    store: MlflowClient, tracked: TrackedRun, capsys: pytest.CaptureFixture[str]
) -> None:
    progress = _rank_0(tracked)
    tags = []
    with progress.tracking():
        for (step, forward), (_, backward), trapped in zip(
            TRAPPED_FORWARD, TRAPPED_BACKWARD, (0, 0, 9), strict=True
        ):
            progress.after_validation(step, _sums(forward, backward, trapped), None)
            tags.append(store.get_run(tracked.run_id).data.tags.get(HEALTH_TAG))
        progress.after_validation(4000, _sums(140.0, 138.0, 0), None)  # healthy again

    run_id = tracked.run_id
    trapped_history = [
        (metric.step, metric.value)
        for metric in store.get_metric_history(run_id, f"{TRAPPED_ROWS}_forward")
    ]
    # charted from the first validation that locked a row up: a line of zeros says nothing
    assert trapped_history == [(3000, 9.0), (4000, 0.0)]
    backward = store.get_metric_history(run_id, f"{TRAPPED_ROWS}_backward")
    assert [(m.step, m.value) for m in backward] == [(3000, 0.0), (4000, 0.0)]
    assert tags == [None, None, f"step 3000: {RISE}; {PARTING}"]
    assert store.get_run(run_id).data.tags[HEALTH_TAG] == tags[-1]  # kept once healthy again
    lines = capsys.readouterr().out.splitlines()
    (locked_up,) = [line for line in lines if "locked up" in line]
    assert locked_up.startswith("[train] step 3000: validation perplexity")
    assert locked_up.endswith("sample; forward: 9 of 128 rows locked up (cells at the clip)")
    warnings = [line for line in lines if "WARNING" in line]
    assert warnings == [
        f"[train] WARNING step 3000: {RISE}",
        f"[train] WARNING step 3000: {PARTING}",
    ]


def test_figures_are_redrawn_at_most_once_an_interval_and_as_the_run_ends(
    store: MlflowClient, tracked: TrackedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[str] = []

    def log_curves(curves: object, artifact_file: str, **labels: object) -> None:
        drawn.append(artifact_file)
        figures.log_curves(curves, artifact_file, **labels)

    monkeypatch.setattr("pipelines.train.progress.log_curves", log_curves)
    progress = _rank_0(tracked, console=False)
    both = ["curves/train_sampled_loss.png", "curves/validation_perplexity.png"]
    with progress.tracking():
        progress.after_validation(1000, _sums(120.0, 118.0, 0), None)
        assert drawn == []  # within the interval of the loop's start
        progress.plot()  # the run's end
        assert drawn == both
        progress.plot()  # nothing new: not drawn again
        assert drawn == both
        monkeypatch.setattr("pipelines.train.progress.FIGURE_INTERVAL_S", 0.0)
        progress.after_validation(2000, _sums(110.0, 109.0, 0), None)
        assert drawn == both * 2  # an interval on, a validation redraws them
    artifacts = {a.path for a in store.list_artifacts(tracked.run_id, "curves")}
    assert artifacts == set(both)
