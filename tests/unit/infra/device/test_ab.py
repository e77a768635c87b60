"""``ab.py``'s verdict: each tree's median over the one before it's, per figure both timed."""

import json

import pytest


@pytest.fixture
def ab():
    from infra.device import ab

    return ab


def test_the_ratio_is_of_medians_over_the_rounds(ab):
    summary = {"ours_positions_per_s": 100.0, "ours_mfu": 0.1, "ours@1024_positions_per_s": 300.0}
    assert ab.rates(summary) == {"ours": 100.0, "ours@1024": 300.0}
    runs = {
        "f29ad39": [{"ours": 100.0, "ours@1024": 300.0}, {"ours": 90.0, "ours@1024": 330.0}],
        "9a4cfe7": [{"ours": 200.0, "ours@1024": 330.0}, {"ours": 190.0, "ours@1024": 363.0}],
        "this": [{"ours": 195.0}, {"ours": 390.0}],
    }
    result = ab.compare(runs)
    assert result["ratio"] == {
        "f29ad39 -> 9a4cfe7": {"ours": pytest.approx(195 / 95, abs=1e-3), "ours@1024": 1.1},
        "9a4cfe7 -> this": {"ours": pytest.approx(292.5 / 195, abs=1e-3)},
    }
    assert result["9a4cfe7"] == {"ours": [200.0, 190.0], "ours@1024": [330.0, 363.0]}


def test_with_impls_each_tree_runs_each_variant_in_turn(ab, monkeypatch, tmp_path, capsys):
    baseline = tmp_path / "baseline-1"
    baseline.mkdir()
    (baseline / "COMMIT").write_text("f29ad39156e730ef9de5e8c37793cea274ef8bf4\n")
    calls = []

    def run(tree, arguments):
        calls.append((tree, arguments))
        return {"ours@128_positions_per_s": 100.0 * len(calls)}

    monkeypatch.setattr(ab, "run", run)
    ab.main([str(baseline), "--impls", "fused,graphed", "--rounds", "1", "--only", "sweep"])

    assert [(tree, arguments[-1]) for tree, arguments in calls] == [
        (baseline, "fused"),
        (baseline, "graphed"),
        (ab.REPO, "fused"),
        (ab.REPO, "graphed"),
    ]
    ratios = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ratio"]
    assert list(ratios) == [
        "f29ad39156e7 fused -> f29ad39156e7 graphed",
        "f29ad39156e7 graphed -> this fused",
        "this fused -> this graphed",
    ]
    assert ratios["this fused -> this graphed"] == {"ours@128": 1.333}


def test_an_option_s_value_is_passed_on_not_taken_for_a_baseline(ab, monkeypatch):
    """``--only sweep`` with no baseline before it: ``sweep`` is gpu_bilm.py's."""
    calls = []
    monkeypatch.setattr(ab, "run", lambda tree, arguments: calls.append(arguments) or {})
    ab.main(["--impls", "fused,graphed", "--rounds", "1", "--only", "sweep"])
    assert calls == [["--only", "sweep", "--lstm-impl", impl] for impl in ("fused", "graphed")]


def test_captured_runs_the_fused_ops_with_the_whole_step_captured(ab, monkeypatch):
    calls = []
    monkeypatch.setattr(ab, "run", lambda tree, arguments: calls.append(arguments) or {})
    ab.main(["--impls", "graphed,captured", "--rounds", "1", "--only", "sweep"])
    assert calls == [
        ["--only", "sweep", "--lstm-impl", "graphed"],
        ["--only", "sweep", "--lstm-impl", "fused", "--capture-step"],
    ]
