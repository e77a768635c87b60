import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_inference.py"
MODELS = ("baseline", "reference", "fused")


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import bench_inference

    return bench_inference


def test_smoke_run_times_the_three_models_with_and_without_load_and_ends_with_json():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "inference" and summary["tokens"] == 25
    for setting in ("tiny_2_t1", "tiny_4_t1_loaded"):
        rates = [summary[f"{setting}_{name}_tokens_per_s"] for name in MODELS]
        assert all(rate > 0 for rate in rates)
        assert summary[f"{setting}_ratio_fused"] == pytest.approx(rates[2] / rates[0], rel=1e-2)
    assert summary["ratio"] == summary["tiny_2_t1_ratio_fused"]


def test_a_setting_names_preset_batch_threads_and_order(bench):
    assert bench.Setting.parse("small:32:2") == bench.Setting("small", 32, 2, False)
    assert bench.Setting.parse("small:32:2:length").key == "small_32_t2_length"


def test_batches_keep_file_order_unless_sorted_by_length(bench):
    sentences = [["a", "b", "c"], ["d"], ["e", "f"]]
    in_order = bench.batches(sentences, 2, by_length=False)
    assert [tuple(ids.shape[:2]) for ids in in_order] == [(2, 3), (1, 2)]
    by_length = bench.batches(sentences, 2, by_length=True)
    assert [tuple(ids.shape[:2]) for ids in by_length] == [(2, 2), (1, 3)]


def test_the_three_models_agree_on_one_set_of_weights(bench):
    models = bench.build_models("tiny")
    differences = bench.max_differences(models, bench.batches(bench.SMOKE_SENTENCES, 5, False)[0])
    assert set(differences) == {"reference", "fused"}
    assert max(differences.values()) < 1e-5
