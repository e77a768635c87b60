"""Pre-flight checks: a configured server that does not answer is named with its variable."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pipelines.common.services import ServiceUnreachable, check_services


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))


def test_embedded_defaults_need_no_server() -> None:
    check_services(ray_jobs=False)


@pytest.mark.parametrize(
    ("variable", "ray_jobs", "server"),
    [("MLFLOW_TRACKING_URI", False, "the MLflow"), ("RAY_API_SERVER_ADDRESS", True, "the Ray")],
)
def test_an_unreachable_http_server_is_named(
    monkeypatch: pytest.MonkeyPatch, variable: str, ray_jobs: bool, server: str
) -> None:
    address = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv(variable, address)

    with pytest.raises(ServiceUnreachable, match=f"{variable}={address}: {server}"):
        check_services(ray_jobs=ray_jobs)


def test_any_http_answer_counts_as_reachable(
    monkeypatch: pytest.MonkeyPatch, http_server: str
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", http_server)
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", http_server)
    check_services(ray_jobs=True)


def test_ray_job_mode_without_an_address_says_which_variable_is_missing() -> None:
    with pytest.raises(ServiceUnreachable, match="RAY_API_SERVER_ADDRESS=: training mode"):
        check_services(ray_jobs=True)


def test_an_unreachable_ray_cluster_address_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)

    with pytest.raises(ServiceUnreachable, match=f"RAY_ADDRESS={address}: the Ray cluster"):
        check_services(ray_jobs=False)
    monkeypatch.setenv("RAY_ADDRESS", "not-an-address")
    with pytest.raises(ServiceUnreachable, match="expected host:port"):
        check_services(ray_jobs=False)
