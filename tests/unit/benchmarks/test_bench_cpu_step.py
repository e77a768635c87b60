import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_cpu_step.py"


@pytest.fixture
def bench_cpu_step(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_cpu_step

    return bench_cpu_step


def test_smoke_run_times_every_variant_and_ends_with_json():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "cpu_step" and summary["steps"] == 2
    setting = "tiny_4x5_t1"
    rates = [
        summary[f"{setting}_{variant}_positions_per_s"]
        for variant in ("reference", "fused", "fused-batched")
    ]
    assert all(rate > 0 for rate in rates)
    assert summary[f"ratio_{setting}"] == pytest.approx(rates[1] / rates[0], rel=1e-2)
    assert summary[f"ratio_batched_{setting}"] == pytest.approx(rates[2] / rates[0], rel=1e-2)
    assert summary["ratio"] == summary[f"ratio_{setting}"]  # one setting: its own ratio
    assert summary["loadavg_1min_before"] >= 0


def test_the_ptb_small_config_and_the_presets_both_name_a_model(bench_cpu_step):
    ptb_small = bench_cpu_step.model_config("ptb-small")
    assert ptb_small.lstm.cell_dim == 512 and ptb_small.num_samples == 2048
    assert bench_cpu_step.model_config("small").lstm.cell_dim == 1024


def test_variants_take_turns_their_order_rotated_each_round(bench_cpu_step):
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    seconds = bench_cpu_step.time_in_turn(runs, steps=3, warmup=1)
    assert set(seconds) == set("abc")
    assert calls == [*"abc", *"abc", *"bca", *"cab"]  # warm-ups, then the rotated rounds
