"""The prepare cache key: inputs, output location and the version of the prepare code."""

from __future__ import annotations

from pathlib import Path

import pytest

import elmo_core
from flows.cache import code_files, dataset_exists, prepare_cache_key
from flows.params import DataParams


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))


def test_code_files_cover_elmo_core_and_the_prepare_package_only() -> None:
    root = Path(elmo_core.__file__).parent.parent
    names = {path.relative_to(root).as_posix() for path in code_files()}
    core = {p.relative_to(root).as_posix() for p in (root / "elmo_core").rglob("*.py")}

    assert core <= names
    prepare = {"stage.py", "run.py", "inputs.py", "encode.py", "output.py", "download.py"}
    assert {f"pipelines/prepare/{name}" for name in prepare} <= names
    assert "pipelines/prepare/sample_corpus.py" in names
    assert not {n for n in names if n.startswith(("pipelines/train/", "pipelines/adapt/"))}
    assert not {n for n in names if n.startswith(("pipelines/registry/", "pipelines/common/"))}


def test_a_new_code_version_gives_a_new_key() -> None:
    data = DataParams(corpus="python-docs")

    assert prepare_cache_key(data, "before") != prepare_cache_key(data, "after")
    assert prepare_cache_key(data, "before") == prepare_cache_key(data, "before")


def test_the_key_follows_corpus_config_and_output() -> None:
    version = "v"
    base = DataParams(corpus="a")
    keys = {
        prepare_cache_key(base, version),
        prepare_cache_key(DataParams(corpus="b"), version),
        prepare_cache_key(DataParams(corpus="a", prepare=["min_count=2"]), version),
        prepare_cache_key(DataParams(corpus="a", out="/elsewhere"), version),
    }

    assert len(keys) == 4
    assert prepare_cache_key(DataParams(corpus="a"), version) == prepare_cache_key(base, version)
    elsewhere = DataParams(corpus="a", prepare=["workers=8", "executor=ray"])  # the same bytes
    assert prepare_cache_key(elsewhere, version) == prepare_cache_key(base, version)


def test_a_dataset_exists_only_while_its_manifest_does(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    assert not dataset_exists(str(dataset))
    (dataset / "manifest.json").write_text("{}")
    assert dataset_exists(str(dataset))
    assert dataset_exists(dataset.as_uri())
