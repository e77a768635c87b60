"""The 1B Word tarball from a URL: a real HTTP server on 127.0.0.1 with Range support.

The server counts the body bytes it sends, so the resume tests prove that only the missing part of
the file travels again.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from elmo_core.errors import DataError
from pipelines.prepare import download as download_module
from pipelines.prepare.corpus_sources import HELDOUT_DIR, TRAIN_DIR, locate_corpus

pytestmark = pytest.mark.integration

TOP = "1-billion-word-language-modeling-benchmark-r13output"
TARBALL = f"{TOP}.tar.gz"


@dataclass
class FileServer:
    """What the handler serves and how it misbehaves; what it saw."""

    files: dict[str, bytes]
    ranges: bool = True
    drop_after: int | None = None  # close the connection after this many body bytes, once
    fail_first: int = 0  # answer 503 to the first N requests
    requests: list[str | None] = field(default_factory=list)  # the Range header of each GET
    bytes_sent: int = 0
    url: str = ""


def _handler(state: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            state.requests.append(self.headers.get("Range"))
            if state.fail_first:
                state.fail_first -= 1
                self.send_error(503, "busy")
                return
            data = state.files.get(self.path.lstrip("/"))
            if data is None:
                self.send_error(404)
                return
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if match and state.ranges:
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
                self.send_header("Accept-Ranges", "bytes" if state.ranges else "none")
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.drop_after is not None:
                body, state.drop_after = body[: state.drop_after], None
                self.close_connection = True
            self.wfile.write(body)
            state.bytes_sent += len(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[FileServer]:
    state = FileServer(files={})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch):
    monkeypatch.setattr(download_module, "BACKOFF_S", 0.0)


def _tarball_bytes() -> bytes:
    members = {f"{TOP}/README": b"readme\n"}
    for i in (1, 2):
        members[f"{TOP}/{TRAIN_DIR}/news.en-{i:05d}-of-00100"] = f"train {i} .\n".encode() * 500
    members[f"{TOP}/{HELDOUT_DIR}/news.en.heldout-00000-of-00050"] = b"held out .\n"
    noise = random.Random(0).randbytes(64 * 1024)  # gzip cannot shrink it: a real body to cut
    members[f"{TOP}/{TRAIN_DIR}/news.en-00003-of-00100"] = noise
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture
def tarball(server: FileServer) -> bytes:
    data = _tarball_bytes()
    server.files[f"data/{TARBALL}"] = data
    return data


def _url(server: FileServer) -> str:
    return f"{server.url}/data/{TARBALL}"


def test_downloads_and_extracts_the_benchmark_from_a_url_once(server, tarball, tmp_path):
    digest = hashlib.sha256(tarball).hexdigest()

    files = locate_corpus(_url(server), "1b-benchmark", tmp_path, sha256=digest)

    assert files.source == _url(server) and files.format == "1b-benchmark"
    assert [p.name for p in files.train] == [f"news.en-0000{i}-of-00100" for i in (1, 2, 3)]
    assert [p.read_text() for p in files.heldout] == ["held out .\n"]
    assert (tmp_path / "downloads" / TARBALL).read_bytes() == tarball
    assert server.requests == [None] and server.bytes_sent == len(tarball)
    assert not list((tmp_path / "downloads").glob("*.part"))

    again = locate_corpus(_url(server), "1b-benchmark", tmp_path, sha256=digest)

    assert again == files and len(server.requests) == 1  # the extraction is reused, no request


def test_a_dropped_connection_resumes_where_it_stopped(server, tarball, tmp_path):
    half = len(tarball) // 2
    server.drop_after = half

    files = locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert len(files.train) == 3
    assert server.requests == [None, f"bytes={half}-"]
    assert server.bytes_sent == len(tarball)  # nothing sent twice


def test_an_existing_part_file_is_continued(server, tarball, tmp_path):
    part = tmp_path / "downloads" / f"{TARBALL}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(tarball[:1000])

    locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert server.requests == ["bytes=1000-"]
    assert server.bytes_sent == len(tarball) - 1000
    assert (tmp_path / "downloads" / TARBALL).read_bytes() == tarball


def test_a_complete_part_file_is_renamed_without_refetching(server, tarball, tmp_path):
    part = tmp_path / "downloads" / f"{TARBALL}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(tarball)

    locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert server.requests == [f"bytes={len(tarball)}-"] and server.bytes_sent == 0


def test_a_server_without_ranges_restarts_the_download(server, tarball, tmp_path):
    server.ranges = False
    part = tmp_path / "downloads" / f"{TARBALL}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"stale bytes from another file")

    locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert (tmp_path / "downloads" / TARBALL).read_bytes() == tarball


def test_transient_errors_are_retried(server, tarball, tmp_path):
    server.fail_first = 2

    files = locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert len(files.train) == 3 and len(server.requests) == 3


def test_too_many_transient_errors_keep_the_partial_file_and_say_so(server, tarball, tmp_path):
    server.fail_first = 100

    with pytest.raises(DataError, match="retries") as err:
        download_module.download(_url(server), tmp_path, max_retries=2, progress=False)

    assert _url(server) in str(err.value) and len(server.requests) == 3


def test_a_sha256_mismatch_names_and_removes_the_download(server, tarball, tmp_path):
    with pytest.raises(DataError, match="sha256 mismatch") as err:
        locate_corpus(_url(server), "1b-benchmark", tmp_path, sha256="ab" * 32)

    assert TARBALL in str(err.value)
    assert list((tmp_path / "downloads").iterdir()) == []
    assert not (tmp_path / "1b-benchmark").exists() or not list(
        (tmp_path / "1b-benchmark").iterdir()
    )


def test_a_missing_url_is_a_data_error(server, tmp_path):
    with pytest.raises(DataError, match="HTTP 404") as err:
        locate_corpus(f"{server.url}/nothing/{TARBALL}", "1b-benchmark", tmp_path)

    assert f"{server.url}/nothing/{TARBALL}" in str(err.value)


def test_a_text_file_url_is_downloaded_as_a_text_corpus(server, tmp_path):
    server.files["corpus.txt"] = b"one sentence .\nanother one .\n"

    files = locate_corpus(f"{server.url}/corpus.txt", "text", tmp_path)

    assert [p.read_bytes() for p in files.train] == [b"one sentence .\nanother one .\n"]


def test_a_truncated_download_is_a_data_error_naming_the_file(server, tmp_path):
    server.files[f"data/{TARBALL}"] = _tarball_bytes()[:-100]

    with pytest.raises(DataError, match="truncated or corrupt") as err:
        locate_corpus(_url(server), "1b-benchmark", tmp_path)

    assert str(Path(tmp_path, "downloads", TARBALL)) in str(err.value)
    assert not (tmp_path / "downloads" / TARBALL).exists()  # the next run downloads it again
