from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.common.settings import elmo_home, mlflow_tracking_uri


def test_elmo_home_is_made_absolute_and_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMO_HOME", "state/home")
    assert elmo_home() == tmp_path / "state" / "home"
    assert (tmp_path / "state" / "home").is_dir()


def test_the_default_store_is_sqlite_at_an_absolute_path_every_process_reaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMO_HOME", "home")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert mlflow_tracking_uri() == f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert mlflow_tracking_uri() == "http://127.0.0.1:5000"
