"""Each timing benchmark run as a module at its ``--smoke`` size: it exits 0 and its last line is
one JSON object with its figures (benchmarks/harness.py's protocol), so the scripts cannot rot."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODELS = ("baseline", "reference", "fused")  # bench_inference's


def cpu_step(summary: dict) -> None:
    assert summary["steps"] == 2
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


def inference(summary: dict) -> None:
    assert summary["tokens"] == 25
    for setting in ("tiny_2_t1", "tiny_4_t1_loaded"):
        rates = [summary[f"{setting}_{name}_tokens_per_s"] for name in MODELS]
        assert all(rate > 0 for rate in rates)
        assert summary[f"{setting}_ratio_fused"] == pytest.approx(rates[2] / rates[0], rel=1e-2)
    assert summary["ratio"] == summary["tiny_2_t1_ratio_fused"]


def step_ops(summary: dict) -> None:
    assert summary["device"] == "meta"
    variants = ("reference_apart", "reference_batched", "fused_batched")
    for rows in (4, 8):
        launches = {v: summary[f"launches_{v}_{rows}"] for v in variants}
        # batching the directions, then fusing each layer, each dispatch fewer ops
        assert launches["reference_apart"] > launches["reference_batched"]
        assert launches["reference_batched"] > launches["fused_batched"] > 0
        assert summary[f"custom_ops_reference_apart_{rows}"] == 0
        assert summary[f"custom_ops_fused_batched_{rows}"] == 4  # 2 layers, forward + backward
        inside = summary[f"inside_fused_batched_{rows}"]
        assert inside > 0
        assert summary[f"flattened_fused_batched_{rows}"] == launches["fused_batched"] - 4 + inside
        assert 0 < summary[f"views_fused_batched_{rows}"] < launches["fused_batched"]
        for variant in variants:
            assert summary[f"predicted_positions_per_s_{variant}_{rows}"] > 0


def threads_under_load(summary: dict) -> None:
    assert summary["hogs"] == 1 and summary["hog_nice"] == 19
    settings = ("1thread", "2threads", "2threads_passive", "2_under_load")
    # the smoke runs no rounds without the load: the same timing, and four processes fewer
    assert not [key for key in summary if "idle" in key]
    rates = {
        "loaded": {setting: summary[f"{setting}_loaded_positions_per_s"] for setting in settings}
    }
    for setting in settings[1:]:
        _assert_rounded_ratio(
            summary[f"ratio_{setting}_vs_1thread"],
            rates["loaded"][setting] / rates["loaded"]["1thread"],
        )
    for load, rate in rates.items():
        _assert_rounded_ratio(
            summary[f"ratio_{load}_2threads_passive_vs_2threads"],
            rate["2threads_passive"] / rate["2threads"],
        )


def _assert_rounded_ratio(ratio: float, quotient: float) -> None:
    """A ratio rounded to 3 places, beside the quotient of its rates rounded to 0.1: off by the
    ratio's rounding (5e-4) plus the rates' (1 % where a loaded machine makes ~5 positions/s)."""
    assert abs(ratio - quotient) <= 5e-4 + 1e-2 * quotient, (ratio, quotient)


def shape_buckets(summary: dict) -> None:
    assert summary["shapes_bucketed@8"] < summary["shapes_exact@8"]
    assert summary["last_new_shape_at_step@8"] <= 12
    assert summary["cnn_work_ratio@8"] >= 1 and summary["softmax_rows_ratio@8"] >= 1


def softmax_rows(summary: dict) -> None:
    one, bound = summary["worker@4x2"], summary["bound@4x2"]
    every, shared = summary["all@4x2"], summary["all_shared_draw@4x2"]
    assert 0 < one <= bound and one <= every <= 2 * bound  # the union of two workers' rows
    assert summary["all_targets@4x2"] <= shared <= every  # one draw for both: fewer rows


def exchange(summary: dict) -> None:
    assert summary["union_rows@2"] > 0
    assert summary["serial@2"] > 0 and summary["overlapped@2"] > 0 and summary["exchange@2"] > 0
    saved = summary["serial@2"] - summary["overlapped@2"]
    assert summary["saved_over_exchange@2"] == pytest.approx(
        saved / summary["exchange@2"], rel=1e-2, abs=1e-2
    )


CHECKS = {"cpu_step": cpu_step, "inference": inference, "step_ops": step_ops}
CHECKS["shape_buckets"] = shape_buckets
CHECKS["threads_under_load"] = threads_under_load
CHECKS["softmax_rows"] = softmax_rows
CHECKS["exchange"] = exchange


@pytest.mark.timeout(600)  # the slowest, exchange: 49 s on the emulated slow machine, in the suite
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_smoke_run_ends_with_one_json_line_of_its_figures(name):
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.bench_{name}", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == name
    CHECKS[name](summary)
