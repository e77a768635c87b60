"""The run directory writes whole or not at all, locally and on an object store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import read_bilm_dir
from elmo_core.presets import tiny
from pipelines.train.run_directory import RunDirectory

VOCAB = 100


@pytest.mark.parametrize("local", [True, False])
def test_run_directory_records_and_models_replace_whole(tmp_path: Path, local: bool) -> None:
    url = str(tmp_path / "run") if local else f"memory://{tmp_path.name}/run"
    run_dir = RunDirectory(url)
    assert run_dir.read_json("FINISHED.json") is None
    run_dir.write_json("FINISHED.json", {"steps": 3})
    run_dir.write_json("FINISHED.json", {"steps": 4})
    assert run_dir.read_json("FINISHED.json") == {"steps": 4}
    first, second = BiLM(tiny(), VOCAB), BiLM(tiny(), VOCAB)
    run_dir.put_model(first, "best")
    run_dir.put_model(second, "best")
    names = sorted(Path(p).name for p in run_dir.fs.ls(run_dir.path, detail=False))
    assert names == ["FINISHED.json", "best"]  # nothing half-written left behind
    if local:
        kept = read_bilm_dir(tmp_path / "run" / "best")
        torch.testing.assert_close(kept.state_dict(), second.state_dict())


@pytest.mark.parametrize("local", [True, False])
def test_files_and_directories_copy_within_the_run_directory(tmp_path: Path, local: bool) -> None:
    url = str(tmp_path / "run") if local else f"memory://{tmp_path.name}/copy"
    run_dir = RunDirectory(url)
    bilm = BiLM(tiny(), VOCAB)
    run_dir.put_model(bilm, "checkpoints/step_000004/model")
    (tmp_path / "rank_0.pt").write_bytes(b"state")
    run_dir.put_file(tmp_path / "rank_0.pt", "checkpoints/step_000004/rank_0.pt")
    run_dir.copy("checkpoints/step_000004/model", "model")
    assert run_dir.subdirectories("checkpoints") == ["step_000004"]
    assert run_dir.exists("checkpoints/step_000004/rank_0.pt") and run_dir.exists("model")
    copied = run_dir.get("model", tmp_path / "downloaded")
    torch.testing.assert_close(read_bilm_dir(copied).state_dict(), bilm.state_dict())
    run_dir.remove("checkpoints")
    assert run_dir.subdirectories("checkpoints") == []


def test_files_follow_the_umask(tmp_path: Path) -> None:
    import os

    previous = os.umask(0o022)
    try:
        run_dir = RunDirectory(str(tmp_path / "run"))
        run_dir.write_json("FINISHED.json", {"steps": 1})
        run_dir.put_model(BiLM(tiny(), VOCAB), "best")
    finally:
        os.umask(previous)
    assert (tmp_path / "run" / "FINISHED.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "run" / "best").stat().st_mode & 0o777 == 0o755
