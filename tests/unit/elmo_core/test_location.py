"""Location: files whole or not at all, locally and on a filesystem of objects (fsspec memory)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_core.location import (
    Location,
    absolute_location,
    atomic_write,
    file_version,
    is_remote_url,
    join_url,
    make_staging_dir,
    open_url,
    remove_temporaries,
    sha256_file,
)


@pytest.fixture(params=["local", "memory"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "local":
        return Location(str(tmp_path / "loc"))
    return Location(f"memory://{tmp_path.name}/loc")


def test_atomic_write_publishes_the_whole_file_and_returns_the_writers_result(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    result = atomic_write(target, lambda temporary: temporary.write_text("hello"))
    assert result == 5
    assert target.read_text() == "hello"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]
    assert sha256_file(target) == hashlib.sha256(b"hello").hexdigest()


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def crash(temporary):
        temporary.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, crash)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_the_temporary_of_a_killed_writer_is_found_and_removed(tmp_path):
    (tmp_path / "out.txt").write_text("old")
    (tmp_path / ".keep").write_text("")  # a hidden file that is not ours stays
    killed_mid_write = (
        "import os, signal, sys; from pathlib import Path;"
        "from elmo_core.location import atomic_write;"
        "atomic_write(Path(sys.argv[1]), lambda t: (t.write_text('half'),"
        " os.kill(os.getpid(), signal.SIGKILL)))"
    )
    subprocess.run([sys.executable, "-c", killed_mid_write, str(tmp_path / "out.txt")])
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.txt.")]
    assert len(left) == 1
    assert remove_temporaries(tmp_path) == left
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep", "out.txt"]
    assert (tmp_path / "out.txt").read_text() == "old"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_and_staging_directories_follow_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        atomic_write(tmp_path / "out.txt", lambda temporary: temporary.write_text("x"))
        staging = make_staging_dir(tmp_path, prefix=".staging.")
    finally:
        os.umask(previous)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    assert staging.stat().st_mode & 0o777 == 0o777 & ~umask


def test_records_read_back_and_a_missing_one_is_none(location: Location) -> None:
    assert location.read_json("a/record.json") is None and location.read_text("x") is None
    location.write_json("a/record.json", {"steps": 3})
    location.write_json("a/record.json", {"steps": 4})
    assert location.read_json("a/record.json") == {"steps": 4}
    assert location.names() == ["a"] and location.names("a") == ["record.json"]
    assert location.subdirectories() == ["a"] and location.subdirectories("a") == []
    assert location.join("a/record.json") == f"{location.url}/a/record.json"


def test_a_write_that_fails_leaves_nothing(location: Location) -> None:
    def fail(path: Path) -> None:
        path.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        location.write("out.bin", fail)
    assert location.names() == [] and not location.exists("out.bin")


def test_directories_are_put_whole_copied_fetched_and_removed(
    location: Location, tmp_path: Path
) -> None:
    for version in ("old", "new"):
        staged = tmp_path / version
        (staged / "sub").mkdir(parents=True)
        (staged / "sub" / "weights").write_text(version)
        (staged / version).write_text(version)
        location.put_directory(staged, "model")
    assert location.names() == ["model"]  # no staging directory left beside it
    assert location.names("model") == ["new", "sub"]  # replaced, not merged
    location.copy("model", "best")
    fetched = location.get("best", tmp_path / "fetched")
    assert (fetched / "sub" / "weights").read_text() == "new"
    location.remove("model")
    location.remove("model")  # already gone: nothing to do
    assert location.subdirectories() == ["best"]


def test_a_files_sha256_is_streamed_from_where_it_is(location: Location, tmp_path: Path) -> None:
    (tmp_path / "part").write_bytes(b"x" * (5 << 20))  # more than one block
    location.put_file(tmp_path / "part", "shards/part")
    assert location.sha256("shards/part") == hashlib.sha256(b"x" * (5 << 20)).hexdigest()
    assert location.sha256("shards/absent") is None


def test_files_are_listed_matched_and_downloaded(location: Location, tmp_path: Path) -> None:
    for name in ("a.txt", "sub/b.txt", "sub/c.bin"):
        location.write_text(name, name)
    assert location.files() == ["a.txt", "sub/b.txt", "sub/c.bin"]
    assert location.files("sub/*.txt") == ["sub/b.txt"]
    assert location.is_file("a.txt") and not location.is_file("sub")
    location.download("sub/b.txt", tmp_path / "copy" / "b.txt")
    assert (tmp_path / "copy" / "b.txt").read_text() == "sub/b.txt"
    assert Location(location.join("absent")).files() == []


def test_a_url_opens_and_its_version_changes_with_the_file(location: Location) -> None:
    location.write_text("x.txt", "one")
    url = join_url(location.url + "/", "x.txt")
    assert url == location.join("x.txt")
    with open_url(url, "rt", encoding="utf-8") as handle:
        assert handle.read() == "one"
    before = file_version(url)
    location.write_text("x.txt", "three")
    assert file_version(url) != before
    with pytest.raises(FileNotFoundError):
        file_version(location.join("absent"))


def test_a_local_location_is_written_with_renames_only(tmp_path: Path) -> None:
    location = Location(f"file://{tmp_path}/loc/")
    assert location.local and location.path == str(tmp_path / "loc")
    location.write_text("x.txt", "whole")
    assert (tmp_path / "loc" / "x.txt").read_text() == "whole"
    assert location.get("x.txt", tmp_path / "unused") == tmp_path / "loc" / "x.txt"
    assert not Location("memory://bucket/loc").local


def test_a_typed_path_means_the_same_in_every_process_and_a_url_stays_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_location("corpus/train.txt") == str(tmp_path / "corpus" / "train.txt")
    assert absolute_location("file://corpus") == str(tmp_path / "corpus")
    assert absolute_location("~/x") == str(Path.home() / "x")
    assert absolute_location("s3://bucket/data") == "s3://bucket/data"
    assert [is_remote_url(u) for u in ("s3://b/k", "gs://b", "file:///tmp/x", "/tmp/x")] == [
        True,
        True,
        False,
        False,
    ]
