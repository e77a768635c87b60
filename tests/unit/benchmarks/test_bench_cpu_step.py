import pytest


@pytest.fixture
def bench_cpu_step():
    from benchmarks import bench_cpu_step

    return bench_cpu_step


def test_the_ptb_small_config_and_the_presets_both_name_a_model(bench_cpu_step):
    ptb_small = bench_cpu_step.model_config("ptb-small")
    assert ptb_small.lstm.cell_dim == 512 and ptb_small.num_samples == 2048
    assert bench_cpu_step.model_config("small").lstm.cell_dim == 1024
