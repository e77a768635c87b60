"""Where files are kept: a local directory or any fsspec URL (``s3://...``), each file whole.

The one module that talks to fsspec. A crash leaves the old file or the new one, never half of one
(docs/architecture.md, "Storage and errors"): locally, files and directories are staged beside
their target and renamed; a remote file is written locally and put whole, as an object store's
put is atomic. A remote directory is many objects: who needs one whole commits it with a marker
written after its parts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

ResultT = TypeVar("ResultT")
_TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}")  # mkstemp(prefix=".NAME."): 8 random chars
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")  # a URL, as opposed to a local path


class Location:
    """A directory by URL; its files are named relative to it (``checkpoints/step_000004``)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = _filesystem(self.url)
        self.local = "file" in self.fs.protocol

    def join(self, name: str) -> str:
        """The URL of ``name``."""
        return f"{self.url}/{name}"

    def exists(self, name: str = "") -> bool:
        return bool(self.fs.exists(self._path(name)))

    def is_file(self, name: str = "") -> bool:
        return bool(self.fs.isfile(self._path(name)))

    def makedirs(self) -> None:
        """Create the directory and its parents (an object store: its bucket) if missing."""
        self.fs.makedirs(self.path, exist_ok=True)

    def open(self, name: str, mode: str = "rb", **options: Any) -> IO[Any]:
        handle: IO[Any] = self.fs.open(self._path(name), mode, **options)
        return handle

    def read_text(self, name: str) -> str | None:
        """The file's text; None when it does not exist."""
        try:
            with self.open(name, "rt", encoding="utf-8") as handle:
                text: str = handle.read()
        except FileNotFoundError:
            return None
        return text

    def read_json(self, name: str) -> dict[str, Any] | None:
        text = self.read_text(name)
        record: dict[str, Any] | None = None if text is None else json.loads(text)
        return record

    def write(self, name: str, write: Callable[[Path], ResultT]) -> ResultT:
        """``write(a local file)``, then that file appears as ``name``, whole; what it returned."""
        if self.local:
            return atomic_write(Path(self._path(name)), write)
        with tempfile.TemporaryDirectory(prefix="elmo-") as scratch:
            local = Path(scratch) / Path(name).name
            result = write(local)
            self._put(local, name)
        return result

    def write_text(self, name: str, text: str) -> None:
        self.write(name, lambda path: path.write_text(text, encoding="utf-8"))

    def write_json(self, name: str, record: dict[str, Any]) -> None:
        self.write_text(name, json.dumps(record, indent=2))

    def put_file(self, local: Path, name: str) -> None:
        """Copy one local file to ``name``, whole."""
        if self.local:
            atomic_write(Path(self._path(name)), lambda path: shutil.copyfile(local, path))
        else:
            self._put(local, name)

    def put_directory(self, local: Path, name: str) -> None:
        """Copy the local directory to ``name``, replacing it: locally renamed into place whole."""
        if not self.local:
            self.remove(name)
            self._put(local, name)
            return
        target = Path(self._path(name))
        target.parent.mkdir(parents=True, exist_ok=True)
        incoming = make_staging_dir(target.parent, prefix=f".{target.name}.")
        shutil.copytree(local, incoming, dirs_exist_ok=True)
        follow_umask(incoming)  # copytree kept the staging directory's 0700
        if target.exists():
            shutil.rmtree(target)
        incoming.rename(target)

    def get(self, name: str, local: Path) -> Path:
        """``name`` (a file or directory) as a local path: itself when local, else a copy."""
        if self.local:
            return Path(self._path(name))
        self.fs.get(self._path(name), str(local), recursive=True)
        return local

    def download(self, name: str, local: Path) -> None:
        """Copy the file ``name`` to the local file ``local``, a copy even when this is local."""
        local.parent.mkdir(parents=True, exist_ok=True)
        self.fs.get_file(self._path(name), str(local))

    def copy(self, source: str, name: str) -> None:
        """Copy the directory ``source`` to ``name``, replacing it."""
        if self.local:
            self.put_directory(Path(self._path(source)), name)
            return
        self.remove(name)
        self.fs.copy(self._path(source), self._path(name), recursive=True)

    def remove(self, name: str) -> None:
        """Remove the file or directory ``name``, if it is there."""
        path = self._path(name)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def names(self, name: str = "") -> list[str]:
        """What the directory ``name`` holds, by name, as it is now; none if it does not exist."""
        return sorted(entry for entry, _ in self._listing(name))

    def subdirectories(self, name: str = "") -> list[str]:
        """The directories directly under ``name``, by name; none if it does not exist."""
        return sorted(entry for entry, kind in self._listing(name) if kind == "directory")

    def files(self, pattern: str = "") -> list[str]:
        """Every file under this directory, or those matching the glob ``pattern``, by name
        relative to it (``sub/b.txt``); none if it does not exist."""
        if pattern:
            found = self.fs.glob(self._path(pattern), detail=True)
        else:
            found = self.fs.find(self.path, detail=True)
        root = self.path.rstrip("/") + "/"
        return sorted(
            path.removeprefix(root)
            for path, info in found.items()
            if path.startswith(root) and info["type"] == "file"
        )

    def sha256(self, name: str) -> str | None:
        """The file's sha256; None when it does not exist."""
        try:
            with self.open(name) as handle:
                return sha256_of(handle)
        except FileNotFoundError:
            return None

    def _listing(self, name: str) -> list[tuple[str, str]]:
        path = self._path(name)
        if not self.fs.isdir(path):
            return []
        return [
            (entry["name"].rstrip("/").rsplit("/", 1)[-1], entry["type"])
            for entry in self.fs.ls(path, detail=True)
        ]

    def _put(self, local: Path, name: str) -> None:
        """Upload a local file, or a directory (``name`` must not exist yet), as ``name``."""
        if local.is_dir():
            self.fs.put(str(local), self._path(name), recursive=True)
        else:
            self.fs.put_file(str(local), self._path(name))

    def _path(self, name: str) -> str:
        return f"{self.path}/{name}" if name else self.path


def atomic_write(path: Path, write: Callable[[Path], ResultT]) -> ResultT:
    """``write(temporary)``, then rename ``temporary`` to ``path``; returns what it returned.

    The file ends with the umask's mode, as if ``write`` had opened ``path`` itself.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(descriptor)
    try:
        result = write(Path(temporary))
        follow_umask(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return result


def is_temporary(name: str) -> bool:
    """Is ``name`` one of :func:`atomic_write`'s temporaries (``.NAME.XXXXXXXX``)?"""
    return _TEMPORARY_NAME.fullmatch(name) is not None


def remove_temporaries(directory: Path) -> list[Path]:
    """Remove what :func:`atomic_write` left in ``directory`` when its process was killed before
    its clean-up ran (``.NAME.XXXXXXXX``, the temporary's name); the paths removed."""
    removed = []
    for path in directory.glob(".*"):
        if is_temporary(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def make_staging_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory under ``parent`` with the umask's mode."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    follow_umask(staging)
    return staging


def follow_umask(path: Path) -> None:
    """Give ``path`` (a file, or a directory and all under it) the mode the umask allows:
    0666 for files, 0777 for directories, less the umask.

    ``tempfile`` stages files 0600 and directories 0700 whatever the umask; without this a team's
    shared dataset or run directory would be readable by its writer alone.
    """
    mask = _current_umask()
    if not path.is_dir():
        path.chmod(0o666 & ~mask)
        return
    path.chmod(0o777 & ~mask)
    for entry in path.rglob("*"):
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def _current_umask() -> int:
    """The process's umask, read without changing it (``/proc``), else by setting it back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sha256_of(handle: IO[bytes]) -> str:
    """The hex sha256 of what ``handle`` reads, block by block (a shard never whole in memory):
    the one place a file's bytes are hashed."""
    readable: Any = handle  # open()'s and fsspec's files have readinto; IO[bytes] does not say so
    return hashlib.file_digest(readable, "sha256").hexdigest()


def sha256_file(path: Path) -> str:
    """The hex sha256 of a local file."""
    with open(path, "rb") as handle:
        return sha256_of(handle)


def join_url(root: str, relative: str) -> str:
    """``root/relative`` for a local path or any fsspec URL."""
    return f"{root.rstrip('/')}/{relative}"


def is_remote_url(location: str) -> bool:
    """A URL with a scheme other than ``file`` (``s3://``, ``gs://``, ``http://``...)."""
    return bool(_SCHEME.match(location)) and not location.startswith("file://")


def absolute_location(location: str | Path) -> str:
    """A remote URL as it is; a local path (or ``file://`` URL) absolute, ``~`` expanded: a Ray
    worker runs in another directory, so the driver resolves what the user typed."""
    text = str(location)
    if is_remote_url(text):
        return text
    return str(Path(text.removeprefix("file://")).expanduser().resolve())


def open_url(url: str, mode: str = "rb", **options: Any) -> IO[Any]:
    """One file, a local path or any fsspec URL, opened (FileNotFoundError when missing)."""
    fs, path = _filesystem(url)
    handle: IO[Any] = fs.open(path, mode, **options)
    return handle


def file_version(url: str) -> str:
    """What changes when the file at ``url`` does: its size and modification time (an object
    store's ETag where it keeps no time); FileNotFoundError when it is not there."""
    fs, path = _filesystem(url)
    info = fs.info(path)
    return f"{info.get('size')}:{info.get('mtime') or info.get('LastModified') or info.get('ETag')}"


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path in it.

    fsspec (asyncio with it) is imported on the first call, not by every process that imports
    this module for :func:`atomic_write` (a prepare worker). Several processes write at once
    (ranks, actors, the driver): a cached listing, fsspec's default for object stores, would
    hide what they wrote or removed since.
    """
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, use_listings_cache=False)
    return fs, path
