"""The device's environment as the GPU suite sees it: what it carries, and that the suite imports
nothing else (a process ``device_env`` guards sees only the packages the device would have)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SUITE = REPO / "infra" / "device" / "gpu_suite.sh"


@pytest.fixture
def device_env():
    from infra.device import device_env

    return device_env


def guarded(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.device.device_env", "guard", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_carried_wheels_are_the_roots_closure_at_the_pinned_versions(device_env):
    wheels = dict(spec.split("==") for spec in device_env.carried_wheels())
    pinned = device_env.pinned_versions()
    assert all(pinned[name] == version for name, version in wheels.items())
    # pydantic 2.14 needs typing_extensions >= 4.16, which the image's may not be
    assert {"pydantic", "pydantic-core", "typing-extensions", "annotated-types"} <= set(wheels)
    assert {"sacremoses", "regex", "joblib", "pytest-timeout", "pluggy"} <= set(wheels)
    assert not {"torch", "numpy", "pyarrow", "h5py", "mlflow", "ray", "prefect"} & set(wheels)


def test_the_suites_tests_collect_with_only_the_devices_imports():
    """Fails when a conftest the suite's tests load imports MLflow (or Ray, Prefect) again."""
    from infra.device import rehearse

    paths = rehearse.suite_test_paths(SUITE.read_text())
    assert len(paths) >= 5
    result = guarded("-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *paths)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for path in paths:
        assert path.removesuffix(".py") in result.stdout, f"{path} collected no test"


def test_a_conftest_that_imports_mlflow_is_named(tmp_path):
    (tmp_path / "conftest.py").write_text("import mlflow\n")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    result = guarded("-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path))
    assert result.returncode != 0
    assert "No module named 'mlflow'" in result.stdout + result.stderr


def test_a_wheel_left_out_of_the_carried_list_fails_the_import_naming_it(device_env, tmp_path):
    allowed = device_env.allowed_distributions() - {"pydantic"}
    view = device_env.device_view(tmp_path, allowed)
    assert (view / "yaml").exists() and (view / "torch").exists()  # carried, the image's
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import elmo_core.config"],
        env={"PYTHONPATH": f"{view}:{REPO}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "No module named 'pydantic'" in result.stderr


def test_the_gpu_benchmark_runs_with_only_the_devices_imports():
    result = guarded("-m", "infra.device.gpu_bilm", "--smoke", "--device", "meta")
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"device": "meta"' in result.stdout.strip().splitlines()[-1]


def test_each_baseline_is_its_commits_tree_with_its_name_in_the_order_given(device_env, tmp_path):
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD~1"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "baseline-3").mkdir()  # a previous call's
    trees = device_env.baselines(["HEAD~1", "HEAD"], tmp_path)
    assert trees == [tmp_path / "baseline-1", tmp_path / "baseline-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline-1", "baseline-2"]
    baseline = trees[0]
    assert (baseline / "COMMIT").read_text().strip() == commit
    assert (baseline / "infra" / "device" / "gpu_bilm.py").is_file()
    shown = subprocess.run(
        ["git", "show", f"{commit}:elmo_core/model/lstm/fused_training.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (baseline / "elmo_core" / "model" / "lstm" / "fused_training.py").read_text() == shown
