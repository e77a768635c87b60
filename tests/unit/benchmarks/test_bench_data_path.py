"""benchmarks/bench_data_path.py on a dataset of its own: the script cannot rot."""

import json

import pytest


@pytest.fixture
def bench():
    from benchmarks import bench_data_path

    return bench_data_path


@pytest.mark.parametrize("workers", [0, 2])
def test_measures_positions_and_the_trainers_cpu_per_step(bench, make_dataset, workers):
    dataset = make_dataset([f"a sentence of {i} words" for i in range(50)], {"h.txt": ["a b"]})

    rate, cpu_ms = bench.measure(dataset, rows=4, unroll=5, workers=workers, steps=10)

    assert rate > 0 and cpu_ms > 0


def test_without_ptb_it_skips_with_a_json_last_line(bench, tmp_path, capsys):
    assert bench.main(["--data-root", str(tmp_path)]) == 0

    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["benchmark"] == "data_path" and "no PTB" in last["skipped"]
