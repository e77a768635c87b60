"""The output directory: whole files, and a re-run only into the output of the same settings."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from elmo_core.errors import ConfigError
from pipelines.embed.output import SETTINGS_FILE, EmbeddingsDir

SETTINGS = {"bilm": "/models/a", "output": "all", "inputs": [{"name": "in.txt", "size": 3}]}


def test_a_new_directory_records_its_settings_and_accepts_them_again(tmp_path):
    out = EmbeddingsDir(str(tmp_path / "out"))

    out.claim(SETTINGS)
    out.claim(json.loads(json.dumps(SETTINGS)))

    assert json.loads((tmp_path / "out" / SETTINGS_FILE).read_text()) == SETTINGS


def test_other_settings_are_refused_naming_what_differs(tmp_path):
    out = EmbeddingsDir(str(tmp_path))
    out.claim(SETTINGS)

    with pytest.raises(ConfigError, match=r"differs in bilm, output\): use another --out"):
        out.claim({**SETTINGS, "bilm": "/models/b", "output": "top"})


def test_a_directory_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")

    with pytest.raises(ConfigError, match=r"did not write \(notes\.txt\)"):
        EmbeddingsDir(str(tmp_path)).claim(SETTINGS)


def test_files_appear_whole_under_their_name_and_leave_no_temporary(tmp_path):
    out = EmbeddingsDir(str(tmp_path))
    table = pa.table({"x": [1, 2, 3]})

    out.write_table("part-000000.parquet", table)

    assert out.names() == ["part-000000.parquet"]
    assert out.read_table("part-000000.parquet").equals(table)


def test_a_write_that_fails_leaves_nothing(tmp_path):
    out = EmbeddingsDir(str(tmp_path))

    def fail(path):
        path.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        out.write("embeddings.hdf5", fail)
    assert out.names() == []


def test_a_remote_directory_is_written_through_fsspec():
    out = EmbeddingsDir("memory://embed-test/out")
    out.claim(SETTINGS)
    out.write_table("part-000001.parquet", pa.table({"x": [1]}))

    assert out.names() == [SETTINGS_FILE, "part-000001.parquet"]
    assert out.exists("part-000001.parquet") and not out.exists("part-000002.parquet")
    out.remove("part-000001.parquet")
    assert out.names() == [SETTINGS_FILE]
    assert out.join("x") == "memory://embed-test/out/x"
