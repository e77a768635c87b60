"""The first-contact run's stages: each boxed, each result in the log as soon as it ends."""

import json
import sys

import pytest


@pytest.fixture
def first_contact():
    from infra.device import first_contact

    return first_contact


def test_a_stage_past_its_box_is_stopped_and_the_next_commands_do_not_run(first_contact, tmp_path):
    log = tmp_path / "first-contact.log"
    slow = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    never = [sys.executable, "-c", "print('{\"ran\": true}')"]
    stage = first_contact.Stage("slow", 1.0, [slow, never])

    result = first_contact.run_stage(stage, log, {"PATH": "/usr/bin:/bin"})

    assert result["status"] == "stopped at its box"
    assert result["seconds"] < 10
    assert "started" in log.read_text()  # what it printed before the stop is kept
    assert "ran" not in log.read_text()


def test_a_command_that_finished_is_done_though_a_child_it_left_holds_its_output(
    first_contact, tmp_path
):
    """As pytest's compile workers did: the stage's work finished inside its box, and the stage
    was marked stopped, waiting for a child that kept the output open."""
    leaves_a_child = [
        sys.executable,
        "-c",
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); print('40 passed in 1.0s', flush=True)",
    ]
    stage = first_contact.Stage("correctness", 5.0, [leaves_a_child])

    result = first_contact.run_stage(stage, tmp_path / "log", {"PATH": "/usr/bin:/bin"})

    assert result["status"] == "ok" and result["seconds"] < 5
    assert result["results"] == ["40 passed in 1.0s"]


def test_the_speed_stage_times_the_cuda_default_with_fused_and_the_captured_step_beside_it(
    first_contact, tmp_path
):
    (speed,) = [stage for stage in first_contact.stages(tmp_path, False) if stage.name == "speed"]
    graphed, fused, captured = speed.commands
    assert graphed[graphed.index("--lstm-impl") + 1] == "graphed"
    assert fused[fused.index("--lstm-impl") + 1] == "fused"
    assert all("--batch-directions" in command for command in speed.commands)
    assert graphed[graphed.index("--sweep") + 1] == "1024"  # and 128, its default batch
    assert fused[fused.index("--sweep") + 1] == "128,1024"
    assert "--capture-step" in captured and "--capture-step" not in fused
    assert captured[captured.index("--sweep") + 1] == "128,1024"


def test_each_command_gives_its_last_json_line_or_its_last_line(first_contact, tmp_path):
    figures = [sys.executable, "-c", "print('table'); print('{\"rate\": 2.5}')"]
    counts = [sys.executable, "-c", "print('3 passed, 1 skipped in 0.1s')"]
    stage = first_contact.Stage("both", 30.0, [figures, counts])

    result = first_contact.run_stage(stage, tmp_path / "log", {"PATH": "/usr/bin:/bin"})

    assert result["status"] == "ok"
    assert result["results"] == [{"rate": 2.5}, "3 passed, 1 skipped in 0.1s"]


def test_a_failing_command_marks_the_stage_and_stops_it(first_contact, tmp_path):
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    stage = first_contact.Stage("broken", 30.0, [failing, failing])

    result = first_contact.run_stage(stage, tmp_path / "log", {"PATH": "/usr/bin:/bin"})

    assert result["status"] == "failed (exit 3)"
    assert len(result["results"]) == 1


def test_the_rehearsal_runs_every_stage_and_ends_the_log_with_one_json_object(
    first_contact, tmp_path, monkeypatch
):
    quick = [sys.executable, "-c", "print('{\"figure\": 1}')"]
    monkeypatch.setattr(
        first_contact,
        "stages",
        lambda out, rehearse: [
            first_contact.Stage("one", 30.0, [quick]),
            first_contact.Stage("extra", 10_000.0, [quick], optional=True),  # no time for it
        ],
    )

    assert first_contact.main([str(tmp_path), "--rehearse"]) == 0

    lines = (tmp_path / first_contact.LOG).read_text().splitlines()
    summary = json.loads(lines[-1])
    assert summary["stages"]["one"]["results"] == [{"figure": 1}]
    assert summary["stages"]["extra"]["status"].startswith("skipped")
    assert any(line.startswith("STAGE one ") for line in lines)  # written as the stage ended
