"""Fetching remote corpus files into the local cache: resumable HTTP(S), and other fsspec URLs.

A download grows as ``<name>.part`` and is renamed once its size (and sha256, when configured)
checks out, so a final name is always a whole file; an interrupted one resumes by HTTP ``Range``.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import IO, BinaryIO

from elmo_core.errors import DataError
from elmo_core.location import Location, open_url, sha256_file
from pipelines.common.console import console_progress

CHUNK_BYTES = 1 << 20
BACKOFF_S = 1.0  # first retry delay after a failure without progress; doubles each time
COMPLETE_MARKER = ".complete"  # inside a cache directory: it was fully written
TRANSIENT_HTTP_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
USER_AGENT = "elmo-platform/0.1 (corpus download)"


class _TransientError(Exception):
    """A failure worth retrying: the connection dropped, timed out, or the server was busy."""


def is_http_url(text: str) -> bool:
    """Whether ``text`` is an ``http://`` or ``https://`` URL."""
    return urllib.parse.urlsplit(text).scheme in ("http", "https")


def url_file_name(url: str) -> str:
    """The last path segment of ``url`` (what the file is called in the download cache)."""
    name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name
    if not name or name in (".", ".."):
        raise DataError("URL does not end in a file name", path=url)
    return name


def download(
    url: str,
    dest_dir: Path,
    *,
    sha256: str | None = None,
    max_retries: int = 5,
    timeout_s: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download ``url`` into ``dest_dir`` (resuming a previous ``.part``) and return the file.

    An already complete file is reused (and re-verified when ``sha256`` is given). Transient errors
    (connection resets, timeouts, HTTP 408/429/5xx) are retried up to ``max_retries`` times in a
    row, with exponential backoff from :data:`BACKOFF_S`; any progress resets the count and resumes
    at once. Other HTTP errors (404, 403) fail at once with a :class:`DataError` naming the URL.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / url_file_name(url)
    if final.is_file():
        if sha256:
            verify_sha256(final, sha256, remove=True)
        return final
    part = final.with_name(final.name + ".part")
    failures = 0
    while True:
        before = _size(part)
        try:
            _fetch_into(url, part, timeout_s=timeout_s, progress=progress)
            break
        except _TransientError as err:
            failures = 0 if _size(part) > before else failures + 1
            if failures > max_retries:
                raise DataError(
                    f"download failed after {max_retries} retries: {err}; "
                    f"the partial file {part} is kept and a re-run resumes it",
                    path=url,
                ) from None
            if failures:  # no progress: wait before trying again; after progress, resume at once
                time.sleep(BACKOFF_S * 2 ** (failures - 1))
    if sha256:
        verify_sha256(part, sha256, remove=True)
    part.replace(final)
    return final


def _fetch_into(url: str, part: Path, *, timeout_s: float, progress: bool) -> None:
    """One attempt: request the bytes after ``part``'s current size and append them."""
    offset = _size(part)
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset and _range_total(err.headers.get("Content-Range")) == offset:
            return  # the .part already holds every byte; a previous run stopped before the rename
        if err.code == 416:
            part.unlink(missing_ok=True)  # the .part is longer than the file: start over
            raise _TransientError(f"HTTP 416 for a {offset}-byte partial file") from None
        if err.code in TRANSIENT_HTTP_STATUS:
            raise _TransientError(f"HTTP {err.code} {err.reason}") from None
        raise DataError(f"HTTP {err.code} {err.reason}", path=url) from None
    except (OSError, http.client.HTTPException) as err:  # URLError is an OSError
        raise _TransientError(str(getattr(err, "reason", err))) from None
    with response:
        if response.status == 206:
            total = _range_total(response.headers.get("Content-Range"))
            mode = "ab"
        else:  # 200: the server sent the whole file (it ignores ranges, or there was no .part)
            length = response.headers.get("Content-Length")
            total = int(length) if length is not None else None
            offset, mode = 0, "wb"
        with part.open(mode) as out:
            _copy_with_progress(response, out, offset, total, part.name, progress)
    size = _size(part)
    if total is not None and size < total:
        raise _TransientError(f"connection closed at byte {size} of {total}")
    if total is not None and size > total:
        part.unlink()
        raise DataError(f"received {size} bytes, the server announced {total}", path=url)


def _copy_with_progress(
    response: BinaryIO, out: IO[bytes], offset: int, total: int | None, name: str, progress: bool
) -> None:
    """Append the response body to ``out`` with progress (bytes, rate, ETA)."""
    with console_progress(
        total, f"download {name.removesuffix('.part')}", initial=offset, enabled=progress
    ) as bar:
        while True:
            try:
                chunk = response.read(CHUNK_BYTES)
            except (OSError, http.client.HTTPException) as err:
                out.flush()
                raise _TransientError(f"connection lost: {err!r}") from None
            if not chunk:
                return
            out.write(chunk)
            bar.update(len(chunk))


def _range_total(content_range: str | None) -> int | None:
    """The total size in ``Content-Range: bytes 10-99/100`` (or ``bytes */100``)."""
    match = re.fullmatch(r"bytes (?:\d+-\d+|\*)/(\d+)", (content_range or "").strip())
    return int(match.group(1)) if match else None


def verify_sha256(path: Path, expected: str, *, remove: bool = False) -> None:
    """Compare the file's sha256 with ``expected``; on a mismatch (``remove`` it and) raise."""
    digest = sha256_file(path)
    if digest != expected.strip().lower():
        if remove:
            path.unlink(missing_ok=True)
        note = "; the file was removed" if remove else ""
        raise DataError(
            f"sha256 mismatch: expected {expected.strip().lower()}, got {digest}{note}", path=path
        )


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# --- other fsspec URLs and the cache directory -------------------------------------------------


def fetch_file(url: str, dest_dir: Path, sha256: str | None) -> Path:
    """Download one file: http(s) with resume, any other fsspec URL by copying to a ``.part``."""
    if is_http_url(url):
        return download(url, dest_dir, sha256=sha256)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / url_file_name(url)
    if not final.is_file():
        part = final.with_name(final.name + ".part")
        try:
            with open_url(url) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except FileNotFoundError:
            part.unlink(missing_ok=True)
            raise DataError("remote file not found", path=url) from None
        part.replace(final)
    if sha256:
        verify_sha256(final, sha256, remove=True)
    return final


def mirror_remote(url: str, cache_dir: Path) -> Path:
    """Copy the files named by an fsspec URL (file, directory or glob) into the cache, once."""
    target = cache_entry_dir(cache_dir / "remote", url_file_name(url.rstrip("/*")), key=url)
    if (target / COMPLETE_MARKER).is_file():
        return target
    source, names = _remote_files(url)
    if not names:
        raise DataError("remote corpus has no files", path=url)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        for name in names:
            source.download(name, tmp.joinpath(*name.split("/")))
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"source": url}) + "\n", encoding="utf-8")
        publish_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remote_files(url: str) -> tuple[Location, list[str]]:
    """The directory holding the files ``url`` names (a file, a directory or a glob), and
    their names relative to it; a directory's or glob's hidden files (a part starting with
    ``.``) left out."""
    if glob.has_magic(url):
        root = url.split("*")[0].rsplit("/", 1)[0]
        source = Location(root)
        names = source.files(url[len(root) :].lstrip("/"))
    else:
        source = Location(url)
        if source.is_file():
            parent, name = source.url.rsplit("/", 1)
            return Location(parent), [name]
        names = source.files()
    return source, [name for name in names if not any(p.startswith(".") for p in name.split("/"))]


def cache_entry_dir(parent: Path, file_name: str, *, key: str) -> Path:
    """``parent/<name without archive suffix>-<hash of key>``: one directory per distinct source."""
    stem = re.sub(r"(\.tar\.gz|\.tgz|\.tar)$", "", file_name) or "corpus"
    return parent / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def publish_dir(tmp: Path, target: Path) -> None:
    """Rename a finished temporary directory into place; a concurrent winner's copy is kept."""
    if target.exists() and not (target / COMPLETE_MARKER).is_file():
        shutil.rmtree(target)  # left by something other than this module: not trusted
    try:
        tmp.rename(target)
    except OSError:
        if not (target / COMPLETE_MARKER).is_file():
            raise
