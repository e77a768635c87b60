"""Check, before any work, that the servers a flow run will talk to answer.

An unreachable MLflow found after preparing a corpus wastes the run; these checks take a second and
name the address and the variable it came from. Only configured servers are checked.
"""

from __future__ import annotations

import os
import socket
import urllib.error
import urllib.request
from urllib.parse import urlparse

from elmo_core.errors import ElmoError
from pipelines.common.settings import RAY_JOBS_ENV, mlflow_tracking_uri

TIMEOUT_S = 5.0


class ServiceUnreachable(ElmoError):
    """A configured server did not answer; the message names its address and variable."""

    def __init__(self, message: str, *, address: str, variable: str) -> None:
        super().__init__(f"{variable}={address}: {message}")
        self._remember(message, address=address, variable=variable)
        self.address = address
        self.variable = variable


def check_services(*, ray_jobs: bool) -> None:
    """MLflow, when it is a server; Ray's jobs API when ``ray_jobs`` (training will be submitted
    there), else ``RAY_ADDRESS`` if set."""
    uri = mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        _check_http(uri, "MLFLOW_TRACKING_URI", "the MLflow tracking server does not answer")
    if ray_jobs:
        address = os.environ.get(RAY_JOBS_ENV)
        if not address:
            message = "training mode 'ray-job' needs the Ray jobs API address"
            raise ServiceUnreachable(message, address="", variable=RAY_JOBS_ENV)
        _check_http(address, RAY_JOBS_ENV, "the Ray jobs API (dashboard) does not answer")
        return
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        _check_tcp(address, "RAY_ADDRESS", "the Ray cluster (GCS) does not answer")


def _check_http(address: str, variable: str, what: str) -> None:
    """Any HTTP answer counts: an error status still proves something listens there."""
    url = address if "://" in address else f"http://{address}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url.rstrip("/") + "/", timeout=TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as err:
        raise ServiceUnreachable(f"{what} ({err})", address=address, variable=variable) from None


def _check_tcp(address: str, variable: str, what: str) -> None:
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.hostname is None or port is None:
        raise ServiceUnreachable("expected host:port", address=address, variable=variable)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=TIMEOUT_S):
            return
    except OSError as err:
        raise ServiceUnreachable(f"{what} ({err})", address=address, variable=variable) from None
