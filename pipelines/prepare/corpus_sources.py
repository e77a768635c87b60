"""Where a corpus comes from: local files, the 1B Word Benchmark tarball, a URL, the bundled sample.

Remote or archived inputs are materialised under ``cache_dir`` atomically, so nothing
half-written looks finished.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import gzip
import json
import os
import re
import shutil
import tarfile
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, cast

from elmo_core.config import CorpusFormat
from elmo_core.errors import ConfigError, DataError
from elmo_core.location import is_remote_url
from pipelines.common.console import ProgressBar, console_progress
from pipelines.prepare.download import (
    COMPLETE_MARKER,
    cache_entry_dir,
    download,
    fetch_file,
    is_http_url,
    mirror_remote,
    publish_dir,
    url_file_name,
    verify_sha256,
)

SAMPLE_CORPUS = "python-docs"
TRAIN_DIR = "training-monolingual.tokenized.shuffled"
HELDOUT_DIR = "heldout-monolingual.tokenized.shuffled"
TRAIN_NAME = re.compile(r"news\.en-\d{5}-of-\d{5}")
HELDOUT_NAME = re.compile(r"news\.en\.heldout-\d{5}-of-\d{5}")
_LAYOUT_MEMBER = re.compile(
    rf"(?:^|/)(?:{re.escape(TRAIN_DIR)}/{TRAIN_NAME.pattern}"
    rf"|{re.escape(HELDOUT_DIR)}/{HELDOUT_NAME.pattern})$"
)
_EXPECTED_LAYOUT = (
    f"expected {TRAIN_DIR}/news.en-000{{01..99}}-of-00100 and "
    f"{HELDOUT_DIR}/news.en.heldout-000{{00..49}}-of-00050 (at least one of each)"
)


@dataclass(frozen=True)
class CorpusFiles:
    """The local files of a corpus, ready to read."""

    source: str  # what the user gave (path or URL), recorded in the manifest
    format: CorpusFormat
    train: list[Path]  # local files, sorted
    heldout: list[Path]  # 1b: the heldout files; text, tokenized: explicit heldout files or []


def locate_corpus(
    corpus: str,
    fmt: str,
    cache_dir: Path,
    *,
    sha256: str | None = None,
    heldout_files: Sequence[str] = (),
) -> CorpusFiles:
    """Find, download or extract ``corpus``; list its train and heldout files (see module doc)."""
    cache_dir = Path(cache_dir).expanduser().absolute()
    if corpus == SAMPLE_CORPUS:
        if fmt != "text":
            raise ConfigError(f"the sample corpus '{corpus}' is plain text", key="format")
        from pipelines.prepare.sample_corpus import write_sample_corpus

        train = write_sample_corpus(cache_dir / SAMPLE_CORPUS)
        return CorpusFiles(corpus, "text", train, [])
    if fmt == "1b-benchmark":
        train, heldout = _locate_1b(corpus, cache_dir, sha256)
        return CorpusFiles(corpus, "1b-benchmark", train, _select_heldout(heldout, heldout_files))
    if fmt == "text" or fmt == "tokenized":
        train, heldout = _locate_text(corpus, cache_dir, sha256, heldout_files)
        return CorpusFiles(corpus, cast(CorpusFormat, fmt), train, heldout)
    raise ConfigError(
        f"unknown corpus format '{fmt}' (expected text, tokenized or 1b-benchmark)", key="format"
    )


# --- 1B Word Benchmark ------------------------------------------------------------------------


def _locate_1b(corpus: str, cache_dir: Path, sha256: str | None) -> tuple[list[Path], list[Path]]:
    if is_remote_url(corpus):
        target = cache_entry_dir(cache_dir / "1b-benchmark", url_file_name(corpus), key=corpus)
        if not (target / COMPLETE_MARKER).is_file():
            tarball = fetch_file(corpus, cache_dir / "downloads", sha256)
            try:
                extract_1b_tarball(tarball, target)
            except DataError as err:  # a bad download must not be reused by the next run
                tarball.unlink(missing_ok=True)
                raise DataError(f"{err} (downloaded from {corpus}; removed)") from None
        return list_1b_files(find_1b_root(target))
    path = Path(corpus).expanduser()
    if path.is_dir():
        return list_1b_files(find_1b_root(path))
    if not path.is_file():
        raise DataError(
            "corpus not found (expected the 1B Word tarball or its directory)", path=path
        )
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    target = cache_entry_dir(cache_dir / "1b-benchmark", path.name, key=key)
    if not (target / COMPLETE_MARKER).is_file():
        if sha256:
            verify_sha256(path, sha256)
        extract_1b_tarball(path, target)
    return list_1b_files(find_1b_root(target))


def find_1b_root(directory: Path, max_depth: int = 3) -> Path:
    """The directory holding the train and heldout folders: ``directory`` or one below it."""
    frontier = [directory]
    for _ in range(max_depth + 1):
        for candidate in frontier:
            if (candidate / TRAIN_DIR).is_dir() and (candidate / HELDOUT_DIR).is_dir():
                return candidate
        frontier = sorted(p for d in frontier for p in d.iterdir() if p.is_dir())
    raise DataError(f"not a 1B Word Benchmark directory: {_EXPECTED_LAYOUT}", path=directory)


def list_1b_files(root: Path) -> tuple[list[Path], list[Path]]:
    """Sorted train and heldout files under a layout root; at least one of each."""
    train = sorted(p for p in (root / TRAIN_DIR).iterdir() if TRAIN_NAME.fullmatch(p.name))
    heldout = sorted(p for p in (root / HELDOUT_DIR).iterdir() if HELDOUT_NAME.fullmatch(p.name))
    if not train or not heldout:
        raise DataError(f"incomplete 1B Word Benchmark layout: {_EXPECTED_LAYOUT}", path=root)
    return [p.absolute() for p in train], [p.absolute() for p in heldout]


def extract_1b_tarball(tarball: Path, target: Path) -> Path:
    """Safely extract the train and heldout members of ``tarball`` into ``target``.

    Every member is checked (absolute paths, ``..``, links leaving the archive, devices raise a
    :class:`DataError` naming the member) and the needed ones are extracted with tarfile's ``data``
    filter into a temporary sibling directory that is renamed to ``target`` once complete, with a
    completion marker inside. The gzip stream is read to its end so its CRC and length catch a
    truncated or corrupt download.
    """
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        num_files = _extract_members(tarball, tmp)
        if num_files == 0:
            raise DataError(
                f"no 1B Word Benchmark files in the archive: {_EXPECTED_LAYOUT}", path=tarball
            )
        list_1b_files(find_1b_root(tmp))  # the layout is complete before it is published
        marker = {"tarball": str(tarball), "files": num_files}
        (tmp / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        publish_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _extract_members(tarball: Path, dest: Path) -> int:
    dest.mkdir(parents=True)
    num_files = 0
    try:
        with _open_decompressed(tarball) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                check_member(member, tarball)
                if _LAYOUT_MEMBER.search(member.name.rstrip("/")):
                    if not member.isfile():
                        raise DataError(
                            f"member '{member.name}' is not a regular file", path=tarball
                        )
                    tar.extract(member, dest, filter="data")
                    num_files += 1
            while stream.read(1 << 20):  # drain to the gzip trailer: CRC and size are checked
                pass
    except tarfile.FilterError as err:
        raise DataError(f"unsafe archive member: {err}", path=tarball) from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise DataError(f"truncated or corrupt archive ({err})", path=tarball) from None
    return num_files


def check_member(member: tarfile.TarInfo, tarball: Path) -> None:
    """Raise :class:`DataError` for a member that could write outside the extraction directory."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or re.match(r"^[A-Za-z]:", member.name):
        raise DataError(f"archive member '{member.name}' has an absolute path", path=tarball)
    if ".." in name.parts:
        raise DataError(
            f"archive member '{member.name}' leaves the archive with '..'", path=tarball
        )
    if member.ischr() or member.isblk() or member.isfifo():
        raise DataError(f"archive member '{member.name}' is a device or fifo", path=tarball)
    if member.issym() or member.islnk():
        base = name.parent if member.issym() else PurePosixPath()
        link = PurePosixPath(member.linkname)
        resolved = os.path.normpath(str(base / link))
        if link.is_absolute() or resolved == ".." or resolved.startswith("../"):
            raise DataError(
                f"archive member '{member.name}' links outside the archive ('{member.linkname}')",
                path=tarball,
            )


class _ProgressReader:
    """A read-only file wrapper that advances a progress bar by the compressed bytes read."""

    def __init__(self, raw: BinaryIO, bar: ProgressBar) -> None:
        self._raw, self._bar = raw, bar

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._bar.update(len(data))
        return data


@contextlib.contextmanager
def _open_decompressed(path: Path) -> Iterator[BinaryIO]:
    """The archive as an uncompressed stream (gzip detected by its magic bytes), with progress."""
    with (
        path.open("rb") as raw,
        console_progress(path.stat().st_size, f"extract {path.name}") as bar,
    ):
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        reader = _ProgressReader(raw, bar)
        stream = cast(BinaryIO, reader)
        yield cast(BinaryIO, gzip.GzipFile(fileobj=stream, mode="rb")) if gzipped else stream


# --- plain text ---------------------------------------------------------------------------------


def _locate_text(
    corpus: str, cache_dir: Path, sha256: str | None, heldout_files: Sequence[str]
) -> tuple[list[Path], list[Path]]:
    base_url = ""
    if is_http_url(corpus):
        corpus = str(download(corpus, cache_dir / "downloads", sha256=sha256))
    elif is_remote_url(corpus):
        base_url, mirror = corpus, mirror_remote(corpus, cache_dir)
        corpus = str(mirror)
    train = expand_text_inputs(corpus)
    heldout: list[Path] = []
    for entry in heldout_files:
        heldout.extend(_expand_heldout(entry, corpus, base_url, cache_dir))
    heldout = sorted(set(heldout))
    train = [p for p in train if p not in set(heldout)]
    if not train:
        raise DataError(
            "every corpus file is listed in heldout_files; nothing left to train on", path=corpus
        )
    if all(p.stat().st_size == 0 for p in train):
        raise DataError(f"all {len(train)} corpus files are empty", path=corpus)
    return train, heldout


def expand_text_inputs(pattern: str) -> list[Path]:
    """The sorted, absolute, resolved files named by a file, a directory or a glob."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        files = list(_visible_files(path))
        what = "directory has no (non-hidden) files"
    elif path.is_file():
        files = [path]
        what = ""
    elif glob.has_magic(pattern):
        files = []
        for match in sorted(glob.glob(str(path), recursive=True)):
            match_path = Path(match)
            files.extend(_visible_files(match_path) if match_path.is_dir() else [match_path])
        what = "glob matched no files"
    else:
        raise DataError("no such file or directory", path=pattern)
    if not files:
        raise DataError(what, path=pattern)
    return sorted({p.resolve() for p in files if p.is_file()})


def _visible_files(directory: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith(".") and Path(dirpath, name).is_file():
                yield Path(dirpath, name)


def _expand_heldout(entry: str, corpus: str, base_url: str, cache_dir: Path) -> list[Path]:
    if base_url and entry.startswith(base_url.rstrip("/") + "/"):
        entry = str(Path(corpus) / entry[len(base_url.rstrip("/")) + 1 :])
    elif is_remote_url(entry) or is_http_url(entry):
        return _locate_text(entry, cache_dir, None, ())[0]
    candidates = [entry]
    if not Path(entry).expanduser().is_absolute() and Path(corpus).is_dir():
        candidates.append(str(Path(corpus) / entry))
    for candidate in candidates:
        if Path(candidate).expanduser().exists() or glob.glob(candidate, recursive=True):
            return expand_text_inputs(candidate)
    raise DataError("heldout file not found (nor under the corpus directory)", path=entry)


def _select_heldout(heldout: list[Path], patterns: Sequence[str]) -> list[Path]:
    """1B Word: keep the heldout files whose name or path matches one of ``patterns``."""
    if not patterns:
        return heldout
    selected = []
    for pattern in patterns:
        matches = [
            p
            for p in heldout
            if fnmatch.fnmatch(p.name, pattern) or fnmatch.fnmatch(str(p), pattern)
        ]
        if not matches:
            raise DataError(
                "matches none of the benchmark's heldout files "
                f"({heldout[0].name} .. {heldout[-1].name})",
                path=pattern,
            )
        selected.extend(matches)
    return sorted(set(selected))
