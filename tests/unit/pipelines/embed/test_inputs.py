"""Input lines → chunks: ids are input lines, empty lines skipped and counted, bad bytes named."""

from __future__ import annotations

import hashlib

import pytest

from elmo_core.errors import DataError
from pipelines.embed.inputs import plan_chunks, read_chunk


def _write(path, lines: list[str]) -> object:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_chunks_hold_a_fixed_number_of_sentences_and_never_span_two_files(tmp_path):
    first = _write(tmp_path / "a.txt", ["one", "two", "three", "four", "five"])
    second = _write(tmp_path / "b.txt", ["six", "seven"])

    plan = plan_chunks([first, second], sentences_per_chunk=2)

    assert [(c.path, c.num_sentences) for c in plan.chunks] == [
        (str(first), 2),
        (str(first), 2),
        (str(first), 1),
        (str(second), 2),
    ]
    assert [c.index for c in plan.chunks] == [0, 1, 2, 3]
    assert [read_chunk(c) for c in plan.chunks] == [
        ([0, 1], ["one", "two"]),
        ([2, 3], ["three", "four"]),
        ([4], ["five"]),
        ([5, 6], ["six", "seven"]),
    ]
    assert plan.num_sentences == 7 and plan.num_empty_lines == 0


def test_empty_lines_are_skipped_and_counted_and_ids_stay_input_lines(tmp_path):
    path = _write(tmp_path / "in.txt", ["", "  first line  ", "\t", "second", "", "third\r"])

    plan = plan_chunks([path], sentences_per_chunk=2)

    assert [read_chunk(c) for c in plan.chunks] == [
        ([1, 3], ["first line", "second"]),
        ([5], ["third"]),
    ]
    assert (plan.num_sentences, plan.num_empty_lines) == (3, 3)


def test_a_last_line_without_newline_is_a_sentence(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"alpha beta\ngamma")

    (chunk,) = plan_chunks([path], sentences_per_chunk=10).chunks

    assert read_chunk(chunk) == ([0, 1], ["alpha beta", "gamma"])


def test_a_line_that_is_not_utf8_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"fine\nalso fine\nbad \xff byte\n")

    with pytest.raises(DataError, match=r"in\.txt:3: not UTF-8 \(byte 5") as caught:
        plan_chunks([path], sentences_per_chunk=10)
    assert (caught.value.path, caught.value.line) == (str(path), 3)


def test_an_input_of_empty_lines_only_is_refused(tmp_path):
    path = _write(tmp_path / "in.txt", ["", "   "])

    with pytest.raises(DataError, match="no sentences"):
        plan_chunks([path], sentences_per_chunk=10)


def test_the_plan_records_each_files_size_and_checksum(tmp_path):
    path = _write(tmp_path / "in.txt", ["a b"])

    (described,) = plan_chunks([path], sentences_per_chunk=10).files

    assert (described.name, described.size) == ("in.txt", 4)
    assert described.sha256 == hashlib.sha256(b"a b\n").hexdigest()


def test_a_chunk_whose_file_changed_since_the_scan_is_a_data_error(tmp_path):
    path = _write(tmp_path / "in.txt", ["a", "b", "c"])
    (chunk,) = plan_chunks([path], sentences_per_chunk=10).chunks
    _write(path, ["a", "", "c"])

    with pytest.raises(DataError, match="changed since the run started"):
        read_chunk(chunk)
