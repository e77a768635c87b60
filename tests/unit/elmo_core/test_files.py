import hashlib
import subprocess
import sys

import pytest

from elmo_core.files import atomic_write, remove_temporaries, sha256_file


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
        "from elmo_core.files import atomic_write;"
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
    import os

    from elmo_core.files import make_staging_dir

    previous = os.umask(umask)
    try:
        atomic_write(tmp_path / "out.txt", lambda temporary: temporary.write_text("x"))
        staging = make_staging_dir(tmp_path, prefix=".staging.")
    finally:
        os.umask(previous)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    assert staging.stat().st_mode & 0o777 == 0o777 & ~umask
