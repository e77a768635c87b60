"""The code version in reuse keys: a change to any file of the named packages changes it."""

from __future__ import annotations

from pathlib import Path

import elmo_core
import pipelines.adapt
from pipelines.common.code_version import ROOT, code_version, source_files


def test_source_files_are_every_python_file_of_the_packages_subpackages_included() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in source_files(elmo_core, pipelines.adapt)}

    assert "elmo_core/tasks/trainer.py" in names and "elmo_core/model/lstm/__init__.py" in names
    assert "pipelines/adapt/stage.py" in names
    assert not {name for name in names if name.startswith(("pipelines/train/", "flows/"))}
    assert source_files(pipelines.adapt, elmo_core) == source_files(elmo_core, pipelines.adapt)


def test_an_edit_a_rename_or_a_new_file_gives_a_new_version(tmp_path: Path) -> None:
    source = tmp_path / "pkg" / "tokenize.py"
    source.parent.mkdir()
    source.write_text("SPLIT = ' '\n")
    before = code_version([source], root=tmp_path)
    assert code_version([source], root=tmp_path) == before

    source.write_text("SPLIT = '\\t'\n")
    edited = code_version([source], root=tmp_path)
    renamed = source.rename(source.with_name("split.py"))
    added = tmp_path / "pkg" / "extra.py"
    added.write_text("")

    versions = {
        before,
        edited,
        code_version([renamed], root=tmp_path),
        code_version([added, renamed], root=tmp_path),
    }
    assert len(versions) == 4
