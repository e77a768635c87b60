"""Files that appear whole or not at all.

Every writer of a dataset shard, a model file or a manifest goes through :func:`atomic_write`: the
content is written under a temporary name in the same directory and renamed into place, so a
crash leaves either the old file or the new one, never half of one (DESIGN.md §5). Reading a
file that may be remote goes through :func:`open_url`.

``tempfile`` creates its files 0600 and directories 0700 whatever the umask; what it stages is
given the mode an ordinary ``open``/``mkdir`` would have (:func:`follow_umask`), so a team's
shared dataset or run directory is readable by whom the umask allows.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

ResultT = TypeVar("ResultT")
_TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}")  # mkstemp(prefix=".NAME."): 8 random chars


def current_umask() -> int:
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


def follow_umask(path: Path) -> None:
    """Give ``path`` (a file, or a directory and all under it) the mode the umask allows:
    0666 for files, 0777 for directories, less the umask."""
    mask = current_umask()
    if not path.is_dir():
        path.chmod(0o666 & ~mask)
        return
    path.chmod(0o777 & ~mask)
    for entry in path.rglob("*"):
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def make_staging_dir(parent: Path, prefix: str) -> Path:
    """A new, uniquely named directory under ``parent`` with the umask's mode."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    follow_umask(staging)
    return staging


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


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def open_url(url: str, mode: str = "rb", **options: Any) -> IO[Any]:
    """``fsspec.open(url, mode).open()``: a local path or any fsspec URL (``s3://...``).

    fsspec is imported here, on first use: with asyncio it costs ~40 ms of start-up that a
    command working on local files (``elmo prepare``) need not pay.
    """
    import fsspec

    return fsspec.open(url, mode, **options).open()
