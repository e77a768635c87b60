"""``ab.py``'s verdict: each tree's median over the one before it's, per figure both timed."""

from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[4] / "infra" / "device"


@pytest.fixture
def ab(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import ab

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
