"""The bundled ``python-docs`` sample corpus: English from the standard library, reproducible."""

from __future__ import annotations

import json

import pytest

from pipelines.prepare import sample_corpus
from pipelines.prepare.corpus_sources import locate_corpus
from pipelines.prepare.sample_corpus import clean_text, write_sample_corpus


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("sample") / "python-docs"
    return dest, write_sample_corpus(dest)


def test_same_interpreter_writes_byte_identical_files(built, tmp_path):
    dest, files = built

    again = write_sample_corpus(tmp_path / "python-docs")

    assert [p.name for p in again] == [p.name for p in files]
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in files]


def test_it_is_a_few_megabytes_of_english_sentences(built):
    _, files = built
    text = "".join(p.read_text(encoding="utf-8") for p in files)
    lines = text.splitlines()

    assert 1_000_000 <= len(text.encode()) <= 3_500_000
    assert len(files) >= 3 and files == sorted(files)
    assert any(p.name.startswith("stdlib-docstrings") for p in files)
    assert not any(
        line.startswith((">>>", "...")) or "``" in line or ":func:`" in line for line in lines
    )
    assert len(set(lines)) == len(lines) and all(line.strip() == line != "" for line in lines)
    common = sum(line.count(" the ") for line in lines)
    assert common > 10_000  # English, not code


def test_a_finished_copy_is_reused_and_a_stale_one_rebuilt(built, monkeypatch):
    dest, files = built
    mtimes = [p.stat().st_mtime_ns for p in files]
    monkeypatch.setattr(sample_corpus, "_write_files", _fail)

    assert write_sample_corpus(dest) == files
    assert [p.stat().st_mtime_ns for p in files] == mtimes

    marker = dest / sample_corpus.MARKER
    stale = json.loads(marker.read_text()) | {"fingerprint": "another interpreter"}
    marker.write_text(json.dumps(stale))
    with pytest.raises(AssertionError, match="rebuilt"):
        write_sample_corpus(dest)
    assert files[0].is_file()  # a failed rebuild leaves the old copy in place


def _fail(out_dir):
    raise AssertionError("rebuilt")


def test_locate_corpus_returns_it_as_a_text_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(sample_corpus, "_write_files", _tiny_corpus)

    files = locate_corpus("python-docs", "text", tmp_path)

    assert files.source == "python-docs" and files.format == "text" and files.heldout == []
    assert files.train == [tmp_path / "python-docs" / "tiny-00.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def _tiny_corpus(out_dir):
    (out_dir / "tiny-00.txt").write_text("A tiny corpus of one sentence.\n")
    return ["tiny-00.txt"]


def test_clean_text_keeps_prose_and_drops_markup_doctests_and_code():
    doc = """Return the :func:`os.path.join` of *parts*, see ``Path``.

    Indented code is dropped.

>>> join("a", "b")
'a/b'

Heading
=======

.. versionadded:: 3.4

:param parts: The parts to join. Each one is a string.

x = f(y)
"""
    assert list(clean_text(doc)) == [
        "Return the os.path.join of parts, see Path.",
        "The parts to join.",
        "Each one is a string.",
    ]
