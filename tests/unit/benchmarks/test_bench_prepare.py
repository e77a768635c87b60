"""benchmarks/bench_prepare.py on a few kB of its own text: the script cannot rot unnoticed."""

import pytest


@pytest.fixture(scope="module")
def bench():
    from benchmarks import bench_prepare

    return bench_prepare


@pytest.fixture(scope="module")
def corpus(bench, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "ptb").mkdir()
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(words[(7 * n + j * j) % 300] for j in range(3 + n % 9)) for n in range(400)]
    (root / "ptb" / "ptb.train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "text").mkdir()
    book = 'Ge1:1 "Call me Ishmael!" Some years ago, never mind how long.\n\nIt was cold. ' * 40
    (root / "text" / "book.txt").write_text(book, encoding="utf-8")
    return bench.build_corpus(root, 40_000, root / "cache", train_files=3, heldout_files=2)


def test_corpus_has_the_1b_layout_its_size_and_growing_types(bench, corpus):
    train, heldout = bench.corpus_files(corpus)
    assert [p.name for p in train] == [f"news.en-0000{i}-of-00100" for i in (1, 2, 3)]
    assert [p.name for p in heldout] == [f"news.en.heldout-0000{i}-of-00050" for i in (0, 1)]
    assert sum(p.stat().st_size for p in train) >= 40_000
    assert all(p.stat().st_size > 0 for p in train + heldout)
    text = " ".join(p.read_text(encoding="utf-8") for p in train)
    assert "_1" in text and "Ge1:1" not in text and "Ishmael" in text


def test_corpus_is_cached_by_its_parameters(bench, corpus):
    root = corpus.parent.parent
    assert bench.build_corpus(root, 40_000, root / "cache", train_files=3) == corpus
    assert bench.build_corpus(root, 40_001, root / "cache", train_files=3) != corpus


def test_naive_and_prepare_agree_when_run_as_the_benchmark_runs_them(bench, corpus, tmp_path):
    env = {**bench.os.environ, "ELMO_HOME": str(tmp_path / "home")}
    naive_out, prepared = bench.fresh(tmp_path / "naive"), bench.fresh(tmp_path / "prepared")
    naive = bench.measure(bench.naive_command(corpus, naive_out, 200), env)
    run = bench.measure(bench.prepare_command(corpus, prepared, 200, 1), env)
    assert list(run.phases) == ["count", "vocabulary", "encode", "shuffle"]
    assert naive.phases is None
    baseline, candidate = bench.read_naive(naive_out), bench.read_prepared(prepared)
    bench.check_agree(baseline, candidate)
    assert len(baseline.vocab) == 200 and baseline.num_oov["train"] > 0
    assert naive.seconds > 0 and naive.cpu_seconds > 0 and naive.main_peak_mb > 0
    candidate.counts[5] += 1
    with pytest.raises(AssertionError, match="counts"):
        bench.check_agree(baseline, candidate)


def test_doubled_corpus_has_twice_the_files_and_the_same_types(bench, corpus):
    doubled = bench.doubled_corpus(corpus)
    train, heldout = bench.corpus_files(corpus)
    train2, heldout2 = bench.corpus_files(doubled)
    assert [p.name for p in train2] == [f"news.en-0000{i}-of-00100" for i in range(1, 7)]
    assert [p.read_bytes() for p in train2] == [p.read_bytes() for p in train + train]
    assert [p.name for p in heldout2] == [p.name for p in heldout]
    assert bench.doubled_corpus(corpus) == doubled  # built once


def test_reference_scaling_is_a_ratio_a_machine_can_have(bench):
    reference = bench.reference_scaling(dict(bench.os.environ), repeats=1)
    assert 0.5 < reference < 2.5  # at most 2x on two or more CPUs, about 1x on one


def test_phases_give_the_parallel_scaling_and_the_two_core_bound(bench):
    w1 = bench.Run(3.0, 3.0, None, None, None, {"count": 1.0, "vocabulary": 0.4, "encode": 1.0})
    w2 = bench.Run(2.0, 3.2, None, None, None, {"count": 0.6, "vocabulary": 0.4, "encode": 0.65})
    figures = bench.phase_scaling(w1, w2)
    assert figures["parallel_scaling_1_to_2"] == pytest.approx(2.0 / 1.25)
    assert figures["serial_seconds"] == pytest.approx(1.0)  # everything outside count + encode
    assert figures["two_core_bound"] == pytest.approx(3.0 / (1.0 + 1.0))
    assert bench.phase_scaling(w1, None) is None
