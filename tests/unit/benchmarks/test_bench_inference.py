import pytest


@pytest.fixture
def bench():
    from benchmarks import bench_inference

    return bench_inference


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
