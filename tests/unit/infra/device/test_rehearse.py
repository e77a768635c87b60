"""The rehearsal's verdict on one part's run: each way a part can fail on the device, named."""

from pathlib import Path

import pytest

SUITE = (Path(__file__).resolve().parents[4] / "infra/device/gpu_suite.sh").read_text()


@pytest.fixture
def rehearse():
    from infra.device import rehearse

    return rehearse


def verdict(rehearse, log: str, out: Path, part: str = "speed-reference", seconds: float = 1.0):
    out.mkdir(exist_ok=True)
    return rehearse.problems(part, log, out, seconds, SUITE)


def test_a_part_that_ends_with_json_within_its_budget_passes(rehearse, tmp_path):
    assert verdict(rehearse, 'timing\n{"ours_positions_per_s": 1.0}\n', tmp_path) == []


@pytest.mark.parametrize(
    ("log", "named"),
    [
        ("RuntimeError: Tensor on device cpu is not on the expected device meta!", "mismatch"),
        ("ModuleNotFoundError: No module named 'mlflow'", "No module named 'mlflow'"),
        (
            "RuntimeError: accessing tensor output of CUDAGraphs that has been overwritten by a "
            "subsequent run",
            "after the next replay",
        ),
        ("Traceback (most recent call last):", "not JSON"),
    ],
)
def test_each_failure_is_named(rehearse, tmp_path, log, named):
    assert any(named in problem for problem in verdict(rehearse, log, tmp_path))


def test_too_many_files_and_too_long_are_named(rehearse, tmp_path):
    for index in range(rehearse.MAX_FILES + 1):
        (tmp_path / f"{index}.log").write_text("")
    found = verdict(rehearse, "{}", tmp_path, seconds=rehearse.BUDGET_SECONDS + 1)
    assert any("come back" in problem for problem in found)
    assert any("budget" in problem for problem in found)


def test_a_test_file_that_collects_nothing_is_named(rehearse, tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.unit.elmo_core.training.test_step" '
        'name="test_a"/></testsuite></testsuites>'
    )
    found = verdict(rehearse, "1 passed", tmp_path, part="tests")
    assert "tests/unit/elmo_core/training collected no test" not in found
    assert "tests/unit/elmo_core/model/lstm/test_directions.py collected no test" in found
    assert "pytest wrote no report" in verdict(rehearse, "", tmp_path / "none", part="tests")[0]


def test_a_module_skipped_whole_counts_as_collected(rehearse, tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="" '
        'name="tests.unit.elmo_core.model.lstm.test_triton_kernels"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    found = verdict(rehearse, "1 skipped", tmp_path, part="tests")
    assert "tests/unit/elmo_core/model/lstm/test_triton_kernels.py collected no test" not in found
