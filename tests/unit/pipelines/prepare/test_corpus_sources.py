"""locate_corpus: the 1B Word layout, safe extraction, plain text inputs, remote mirrors."""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import tarfile
from pathlib import Path

import fsspec
import pytest

from elmo_core.errors import ConfigError, DataError
from pipelines.prepare import corpus_sources
from pipelines.prepare.corpus_sources import (
    HELDOUT_DIR,
    TRAIN_DIR,
    CorpusFiles,
    extract_1b_tarball,
    locate_corpus,
)
from pipelines.prepare.download import COMPLETE_MARKER

TOP = "1-billion-word-language-modeling-benchmark-r13output"
TARBALL = f"{TOP}.tar.gz"


def _benchmark_members(num_train: int = 2, num_heldout: int = 2) -> dict[str, bytes]:
    members = {f"{TOP}/README": b"not part of the corpus\n"}
    for i in range(1, num_train + 1):
        members[f"{TOP}/{TRAIN_DIR}/news.en-{i:05d}-of-00100"] = f"train {i} .\n".encode()
    for i in range(num_heldout):
        members[f"{TOP}/{HELDOUT_DIR}/news.en.heldout-{i:05d}-of-00050"] = f"held {i} .\n".encode()
    return members


def _write_tarball(
    path: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = ()
) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in extra:
            tar.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _write_layout(root: Path, members: dict[str, bytes]) -> None:
    for name, data in members.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


# --- 1B Word Benchmark ------------------------------------------------------------------------


def test_locates_an_extracted_layout_below_its_top_directory(tmp_path):
    _write_layout(tmp_path / "data", _benchmark_members(num_train=3, num_heldout=2))

    files = locate_corpus(str(tmp_path / "data"), "1b-benchmark", tmp_path / "cache")

    assert isinstance(files, CorpusFiles) and files.format == "1b-benchmark"
    assert files.source == str(tmp_path / "data")
    assert [p.name for p in files.train] == [f"news.en-0000{i}-of-00100" for i in (1, 2, 3)]
    assert [p.name for p in files.heldout] == [f"news.en.heldout-0000{i}-of-00050" for i in (0, 1)]
    assert all(p.is_absolute() and p.is_file() for p in files.train + files.heldout)


def test_extracts_only_the_layout_members_and_reuses_the_finished_extraction(tmp_path, monkeypatch):
    tarball = _write_tarball(tmp_path / TARBALL, _benchmark_members())

    first = locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache")

    root = first.train[0].parents[1]
    assert not (root / "README").exists()
    assert (root.parent / COMPLETE_MARKER).is_file()
    assert [p.read_text() for p in first.train] == ["train 1 .\n", "train 2 .\n"]
    monkeypatch.setattr(corpus_sources, "extract_1b_tarball", _fail)
    assert locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache") == first


def _fail(*args, **kwargs):
    raise AssertionError("the finished extraction should have been reused")


def test_heldout_files_select_among_the_benchmark_heldout_files(tmp_path):
    _write_layout(tmp_path, _benchmark_members(num_heldout=3))

    files = locate_corpus(
        str(tmp_path), "1b-benchmark", tmp_path / "c", heldout_files=["*heldout-00000-*"]
    )

    assert [p.name for p in files.heldout] == ["news.en.heldout-00000-of-00050"]
    with pytest.raises(DataError, match=r"\*-99999-\*: matches none"):
        locate_corpus(str(tmp_path), "1b-benchmark", tmp_path / "c", heldout_files=["*-99999-*"])


def test_a_directory_without_the_layout_names_what_was_expected(tmp_path):
    (tmp_path / "something" / TRAIN_DIR).mkdir(parents=True)

    with pytest.raises(DataError, match="heldout-monolingual.tokenized.shuffled") as err:
        locate_corpus(str(tmp_path), "1b-benchmark", tmp_path / "cache")
    assert str(tmp_path) in str(err.value)


def test_a_layout_without_heldout_files_is_incomplete(tmp_path):
    _write_layout(tmp_path, _benchmark_members(num_heldout=0))
    (tmp_path / TOP / HELDOUT_DIR).mkdir()

    with pytest.raises(DataError, match="incomplete 1B Word Benchmark layout"):
        locate_corpus(str(tmp_path), "1b-benchmark", tmp_path / "cache")


def test_a_missing_corpus_path_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="corpus not found") as err:
        locate_corpus(str(tmp_path / "nope.tar.gz"), "1b-benchmark", tmp_path / "cache")
    assert "nope.tar.gz" in str(err.value)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    return info


def _regular(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)  # size 0


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_regular("../evil"), "leaves the archive"),
        (_regular(f"{TOP}/../../evil"), "leaves the archive"),
        (_regular("/etc/evil"), "absolute path"),
        (_link(f"{TOP}/escape", "../../etc/passwd"), "links outside"),
        (_link(f"{TOP}/escape", "/etc/passwd"), "links outside"),
        (_link(f"{TOP}/hard", "../outside", tarfile.LNKTYPE), "links outside"),
        (_device(f"{TOP}/dev"), "device"),
    ],
)
def test_unsafe_members_are_rejected_and_nothing_is_left(tmp_path, member, message):
    tarball = _write_tarball(tmp_path / TARBALL, _benchmark_members(), extra=[member])
    cache = tmp_path / "cache"

    with pytest.raises(DataError, match=message) as err:
        locate_corpus(str(tarball), "1b-benchmark", cache)

    assert member.name in str(err.value) and str(tarball) in str(err.value)
    assert not (tmp_path / "evil").exists()
    assert list((cache / "1b-benchmark").iterdir()) == []  # no half-extracted directory


def test_a_link_inside_the_archive_is_allowed_but_not_extracted(tmp_path):
    member = _link(f"{TOP}/docs/latest", "../README")
    tarball = _write_tarball(tmp_path / TARBALL, _benchmark_members(), extra=[member])

    files = locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache")

    assert not (files.train[0].parents[1] / "docs").exists()


def test_a_layout_member_that_is_a_link_is_rejected(tmp_path):
    members = _benchmark_members()
    name = f"{TOP}/{TRAIN_DIR}/news.en-00009-of-00100"
    tarball = _write_tarball(tmp_path / TARBALL, members, extra=[_link(name, "news.en-00001")])

    with pytest.raises(DataError, match="not a regular file"):
        locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache")


def _big_members() -> dict[str, bytes]:
    members = _benchmark_members()
    noise = random.Random(0).randbytes(128 * 1024)  # gzip cannot shrink it
    members[f"{TOP}/{TRAIN_DIR}/news.en-00003-of-00100"] = noise
    return members


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_a_truncated_tarball_is_a_data_error_naming_the_file(tmp_path, keep):
    tarball = _write_tarball(tmp_path / TARBALL, _big_members())
    data = tarball.read_bytes()
    tarball.write_bytes(data[: int(len(data) * keep)])

    with pytest.raises(DataError, match="truncated or corrupt") as err:
        locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache")

    assert str(tarball) in str(err.value)
    assert list((tmp_path / "cache" / "1b-benchmark").iterdir()) == []


def test_a_tarball_cut_at_a_tar_block_boundary_is_caught_by_the_gzip_trailer(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in _benchmark_members().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    whole = gzip.compress(raw.getvalue())
    tarball = tmp_path / TARBALL
    tarball.write_bytes(whole[:-8])  # every tar block is there; the CRC and size are not

    with pytest.raises(DataError, match="truncated or corrupt"):
        extract_1b_tarball(tarball, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_tarball_is_a_data_error(tmp_path):
    tarball = tmp_path / TARBALL
    tarball.write_bytes(b"\x1f\x8b" + b"garbage" * 100)

    with pytest.raises(DataError, match="truncated or corrupt") as err:
        locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache")
    assert str(tarball) in str(err.value)


def test_a_sha256_mismatch_names_the_file_and_keeps_the_users_tarball(tmp_path):
    tarball = _write_tarball(tmp_path / TARBALL, _benchmark_members())

    with pytest.raises(DataError, match="sha256 mismatch") as err:
        locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache", sha256="0" * 64)

    assert str(tarball) in str(err.value)
    assert tarball.is_file()
    good = hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert locate_corpus(str(tarball), "1b-benchmark", tmp_path / "cache", sha256=good).train


# --- plain text ---------------------------------------------------------------------------------


def _text_tree(root: Path) -> Path:
    for rel in ["a.txt", "sub/b.txt", "sub/deeper/c", "heldout/h.txt", ".hidden", ".git/config"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel} line .\n")
    return root


def test_a_text_directory_lists_all_visible_files_recursively(tmp_path):
    root = _text_tree(tmp_path / "corpus")

    files = locate_corpus(str(root), "text", tmp_path / "cache")

    assert files.format == "text" and files.heldout == []
    names = [p.relative_to(root.resolve()).as_posix() for p in files.train]
    assert names == ["a.txt", "heldout/h.txt", "sub/b.txt", "sub/deeper/c"]


def test_a_text_glob_and_a_single_file(tmp_path):
    root = _text_tree(tmp_path / "corpus")

    globbed = locate_corpus(str(root / "**" / "*.txt"), "text", tmp_path / "cache")
    single = locate_corpus(str(root / "a.txt"), "text", tmp_path / "cache")

    assert [p.name for p in globbed.train] == ["a.txt", "h.txt", "b.txt"]
    assert single.train == [(root / "a.txt").resolve()]


def test_explicit_heldout_files_leave_the_training_files(tmp_path):
    root = _text_tree(tmp_path / "corpus")

    by_glob = locate_corpus(
        str(root), "text", tmp_path / "c", heldout_files=[str(root / "heldout" / "*")]
    )
    relative_to_corpus = locate_corpus(
        str(root), "text", tmp_path / "c", heldout_files=["heldout/h.txt", "sub/deeper/c"]
    )

    assert by_glob.heldout == [(root / "heldout" / "h.txt").resolve()]
    assert (root / "heldout" / "h.txt").resolve() not in by_glob.train
    assert [p.name for p in relative_to_corpus.heldout] == ["h.txt", "c"]
    assert [p.name for p in relative_to_corpus.train] == ["a.txt", "b.txt"]


def test_a_tokenized_corpus_is_found_like_text(tmp_path):
    root = _text_tree(tmp_path / "corpus")

    files = locate_corpus(str(root), "tokenized", tmp_path / "c", heldout_files=["heldout/*"])

    assert files.format == "tokenized"
    assert [p.name for p in files.train] == ["a.txt", "b.txt", "c"]
    assert [p.name for p in files.heldout] == ["h.txt"]


@pytest.mark.parametrize(
    ("make", "corpus", "heldout", "message"),
    [
        (None, "missing-dir", [], "no such file or directory"),
        ("empty-dir", "empty-dir", [], "directory has no"),
        (None, "nothing-*.txt", [], "glob matched no files"),
        ("empty-files", "empty-files", [], "are empty"),
        ("one-file", "one-file", ["one-file/a.txt"], "nothing left to train on"),
        ("one-file", "one-file", ["missing.txt"], "heldout file not found"),
    ],
)
def test_missing_or_empty_text_inputs_name_the_path(
    tmp_path, monkeypatch, make, corpus, heldout, message
):
    monkeypatch.chdir(tmp_path)
    if make == "empty-dir":
        (tmp_path / make).mkdir()
        (tmp_path / make / ".only-hidden").write_text("x")
    elif make == "empty-files":
        (tmp_path / make).mkdir()
        (tmp_path / make / "a.txt").write_text("")
    elif make == "one-file":
        (tmp_path / make).mkdir()
        (tmp_path / make / "a.txt").write_text("x\n")

    with pytest.raises(DataError, match=message) as err:
        locate_corpus(corpus, "text", tmp_path / "cache", heldout_files=heldout)
    assert (heldout[-1] if message.startswith("heldout") else corpus) in str(err.value)


def test_a_remote_text_corpus_is_mirrored_into_the_cache(tmp_path):
    fs = fsspec.filesystem("memory")
    for rel in ["a.txt", "sub/b.txt", "held.txt", ".hidden"]:
        fs.pipe(f"/bucket-{tmp_path.name}/corpus/{rel}", f"{rel} .\n".encode())
    url = f"memory://bucket-{tmp_path.name}/corpus"

    files = locate_corpus(url, "text", tmp_path / "cache", heldout_files=[f"{url}/held.txt"])

    assert files.source == url
    assert [p.name for p in files.train] == ["a.txt", "b.txt"]
    assert [p.name for p in files.heldout] == ["held.txt"]
    assert all(tmp_path / "cache" in p.parents for p in files.train)
    fs.rm(f"/bucket-{tmp_path.name}", recursive=True)
    assert locate_corpus(url, "text", tmp_path / "cache").train[0].read_text() == "a.txt .\n"


def test_formats_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="format"):
        locate_corpus(str(tmp_path), "conll", tmp_path / "cache")
    for fmt in ("1b-benchmark", "tokenized"):
        with pytest.raises(ConfigError, match="plain text"):
            locate_corpus("python-docs", fmt, tmp_path / "cache")
