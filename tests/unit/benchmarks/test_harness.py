"""benchmarks/harness.py: the timing protocol every bench_*.py shares."""

import json

import pytest


@pytest.fixture
def harness():
    from benchmarks import harness

    return harness


def test_variants_take_turns_their_order_rotated_each_round(harness):
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    seconds = harness.time_in_turn(runs, repeats=3, warmup=1)
    assert set(seconds) == set("abc")
    assert calls == [*"abc", *"abc", *"bca", *"cab"]  # warm-ups, then the rotated rounds


def test_the_clock_is_read_only_after_the_device_is_synchronized(harness):
    events = []
    harness.seconds_per_call(lambda: events.append("run"), 2, 0, lambda: events.append("sync"))
    assert events == ["sync", "run", "sync"] * 2


def test_a_disagreement_over_the_tolerance_stops_the_benchmark_naming_it(harness):
    harness.check_agreement({"fused": 1e-6}, 1e-4, "the models")
    with pytest.raises(SystemExit, match="the models disagree.*'fused': 0.5"):
        harness.check_agreement({"reference": 0.0, "fused": 0.5}, 1e-4, "the models")


def test_the_summary_is_the_last_line_and_one_json_object(harness, capsys):
    print("a table")
    harness.print_summary({"benchmark": "x", "ratio": 1.5})
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"benchmark": "x", "ratio": 1.5}
