import hashlib

import pytest

from elmo_core.files import atomic_write, sha256_file


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
