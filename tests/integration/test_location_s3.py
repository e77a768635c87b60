"""Location on S3 (a local moto server): whole objects, and listings that are never stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from elmo_core.location import Location

pytestmark = pytest.mark.integration


def test_a_listing_shows_what_another_writer_did_since(s3_endpoint):
    import s3fs

    location = Location("s3://datasets/run")
    location.write_text("a", "1")
    other = s3fs.S3FileSystem()  # another process's client, with fsspec's listings cache
    assert location.names() == ["a"] and other.ls("datasets/run", detail=False)
    other.pipe_file("datasets/run/b", b"2")
    other.rm("datasets/run/a")
    assert location.names() == ["b"]


def test_files_and_directories_round_trip_through_s3(s3_endpoint, tmp_path: Path):
    location = Location("s3://datasets/run")
    assert location.read_json("FINISHED.json") is None and location.names() == []
    location.write_json("FINISHED.json", {"steps": 4})
    for version in ("old", "new"):
        (tmp_path / version / "sub").mkdir(parents=True)
        (tmp_path / version / "sub" / "weights").write_text(version)
        location.put_directory(tmp_path / version, "checkpoints/step_000004/model")
    location.copy("checkpoints/step_000004/model", "model")
    assert location.read_json("FINISHED.json") == {"steps": 4}
    assert location.subdirectories("checkpoints") == ["step_000004"]
    assert location.names("model") == ["sub"]
    fetched = location.get("model", tmp_path / "fetched")
    assert (fetched / "sub" / "weights").read_text() == "new"
    digest = hashlib.sha256(b"new").hexdigest()
    assert location.sha256("model/sub/weights") == digest and location.sha256("x") is None
    location.remove("checkpoints")
    assert location.subdirectories() == ["model"]
