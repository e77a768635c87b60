"""Start, check and stop the local stack: Prefect server + process worker, MLflow server, Ray head,
and with ``ELMO_STACK_DATABASE=postgresql`` the team setup: a PostgreSQL cluster that both servers
store in and a second Ray node joined to the head (``ray-node``); else each server keeps a SQLite
file and Ray is the head alone (``ELMO_RAY_WORKER_NODE=1`` adds the node there too).

Usage: ``python infra/local/stack.py start|status|stop [--services prefect,worker,mlflow,ray]``.
Everything binds to 127.0.0.1 with state under ``$ELMO_HOME/stack``, so stacks on other ports
coexist. Each service runs in a session of its own, and stop signals the whole session: Ray's
workers leave the process group, not the session (``ray stop`` would end all of the user's Ray).
Ray 2.60 turns token auth on whenever ``~/.ray/auth_token`` exists (and its GCS listens on every
interface), so the head always uses a token of its own; ``start`` and ``status`` print the
``export ...`` lines clients need.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flows.prefect_database import seed_database
from pipelines.common.settings import elmo_home

SERVICE_ORDER = ("postgres", "mlflow", "prefect", "ray", "ray-node", "worker")
STORES = ("sqlite", "postgresql")  # where the MLflow and Prefect servers store
WORKER_NAME = "elmo-local"
LOG_TAIL_LINES = 40
STOP_GRACE_S = 8.0
# `ray start`'s words when its raylet missed its fixed time to register (ray/_private/node.py)
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
# Ray puts Unix sockets under its temp dir; their paths must stay under 107 bytes.
MAX_RAY_TEMP_DIR_CHARS = 40
# A custom resource only the second Ray node has: how its health check finds it among the nodes.
RAY_NODE_RESOURCE = "elmo_worker_node"


# Every client of the stack (the worker's flow runs, Ray's training workers, a user's shell)
# rides out a server restarted under it: MLflow's client retries a refused connection with
# backoff 2, 4, ... s, capped at 120 s, and Prefect's 2, 4, ... 128 s: about 4 minutes each
# (tests/integration/test_team_pipeline.py stops MLflow for 30 s and restarts Prefect mid-run).
CLIENT_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "PREFECT_CLIENT_MAX_RETRIES": "7",
}


class StackError(RuntimeError):
    """A service did not start or stop; the message says which and shows its log tail."""


@dataclass(frozen=True)
class StackConfig:
    """Ports and paths of one local stack, read from ``ELMO_*`` environment variables."""

    home: Path
    prefect_port: int = 4200
    mlflow_port: int = 5000
    ray_port: int = 6379
    ray_dashboard_port: int = 8265
    ray_client_port: int = 10001
    ray_agent_port: int = 52365
    ray_num_cpus: int | None = None
    # One uvicorn process: no supervisor that kills a child slow to boot on a busy machine.
    mlflow_workers: int = 1
    work_pool: str = "elmo-process"
    timeout_s: float = 120.0
    host: str = "127.0.0.1"
    database: str = "sqlite"
    postgres_port: int = 5432
    ray_worker_node: bool = False  # a second Ray node on this machine, joined to the head
    ray_node_agent_port: int = 52366

    @classmethod
    def from_env(cls) -> StackConfig:
        """Defaults overridden by ``ELMO_*`` variables; ``ELMO_HOME`` as the project reads it."""
        environ = os.environ

        def number(key: str, default: int) -> int:
            return int(environ.get(key, default))

        cpus = environ.get("ELMO_RAY_NUM_CPUS")
        database = environ.get("ELMO_STACK_DATABASE", cls.database)
        if database not in STORES:
            raise StackError(f"ELMO_STACK_DATABASE={database!r}: choose one of {STORES}")
        node = environ.get("ELMO_RAY_WORKER_NODE", "1" if database == "postgresql" else "0")
        if node not in ("0", "1"):
            raise StackError(f"ELMO_RAY_WORKER_NODE={node!r}: choose 0 or 1")
        return cls(
            home=elmo_home(),
            prefect_port=number("ELMO_PREFECT_PORT", cls.prefect_port),
            mlflow_port=number("ELMO_MLFLOW_PORT", cls.mlflow_port),
            ray_port=number("ELMO_RAY_PORT", cls.ray_port),
            ray_dashboard_port=number("ELMO_RAY_DASHBOARD_PORT", cls.ray_dashboard_port),
            ray_client_port=number("ELMO_RAY_CLIENT_PORT", cls.ray_client_port),
            ray_agent_port=number("ELMO_RAY_AGENT_PORT", cls.ray_agent_port),
            ray_num_cpus=int(cpus) if cpus else None,
            mlflow_workers=number("ELMO_MLFLOW_WORKERS", cls.mlflow_workers),
            work_pool=environ.get("ELMO_WORK_POOL", cls.work_pool),
            timeout_s=float(environ.get("ELMO_STACK_TIMEOUT_S", cls.timeout_s)),
            database=database,
            postgres_port=number("ELMO_POSTGRES_PORT", cls.postgres_port),
            ray_worker_node=node == "1",
            ray_node_agent_port=number("ELMO_RAY_NODE_AGENT_PORT", cls.ray_node_agent_port),
        )

    @property
    def services(self) -> list[str]:
        """Every service of this stack, in start order."""
        optional = {"postgres": self.on_postgres, "ray-node": self.ray_worker_node}
        return [name for name in SERVICE_ORDER if optional.get(name, True)]

    @property
    def on_postgres(self) -> bool:
        return self.database == "postgresql"

    def database_url(self, name: str, driver: str) -> str:
        """A database of the stack's cluster, as a SQLAlchemy URL."""
        return _postgres_url(self.host, self.postgres_port, name, self.state_dir, driver)

    @property
    def state_dir(self) -> Path:
        return self.home / "stack"

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def ray_dashboard_url(self) -> str:
        return f"http://{self.host}:{self.ray_dashboard_port}"

    @property
    def ray_token_path(self) -> Path:
        return self.state_dir / "ray_auth_token"

    @property
    def ray_temp_dir(self) -> Path:
        return ray_temp_dir(self.home)

    def client_env(self) -> dict[str, str]:
        """What a client exports to use this stack (and what every service of it inherits)."""
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "RAY_ADDRESS": f"{self.host}:{self.ray_port}",
            "RAY_API_SERVER_ADDRESS": self.ray_dashboard_url,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.ray_token_path),
            **CLIENT_RETRIES,
        }


def ray_temp_dir(home: Path) -> Path:
    """Under ELMO_HOME when the path is short enough, else a /tmp name unique to ELMO_HOME."""
    preferred = home / "stack" / "ray"
    if len(str(preferred)) <= MAX_RAY_TEMP_DIR_CHARS:
        return preferred
    digest = hashlib.sha1(str(home).encode()).hexdigest()[:8]
    return Path(f"/tmp/ray-elmo-{os.getuid()}-{digest}")


@dataclass(frozen=True)
class Service:
    """How to launch one service, which ports it takes, and how to tell it is serving."""

    name: str
    command: Callable[[StackConfig], list[str]]
    healthy: Callable[[StackConfig], bool]
    ports: Callable[[StackConfig], dict[str, int]]
    needs: tuple[str, ...] = ()
    # `ray start` forks its daemons and exits 0; the others must keep running.
    daemonizes: bool = False
    needs_database: bool = False  # on the PostgreSQL stack, it stores there
    before_launch: Callable[[StackConfig], None] | None = None  # its state made ready
    after_start: Callable[[StackConfig], None] | None = None  # once healthy, before the next wave
    # a failure whose log says this is launched once more (_wait_healthy_or_relaunch)
    transient_failure: str | None = None

    def prerequisites(self, cfg: StackConfig) -> tuple[str, ...]:
        """The services that must be healthy before this one starts."""
        return (*self.needs, *(("postgres",) if self.needs_database and cfg.on_postgres else ()))


def _bin(name: str) -> str:
    """The tool from this interpreter's environment, so services run the project's versions."""
    return str(Path(sys.executable).parent / name)


def _http_ok(
    url: str, headers: Mapping[str, str] | None = None, body: bytes | None = None
) -> bytes:
    """GET (or POST ``body``) without any proxy; the response body, or b"" when not 200."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    try:
        with opener.open(request, timeout=3) as response:
            return response.read() if response.status == 200 else b""
    except (OSError, ValueError):
        return b""


def _prefect_healthy(cfg: StackConfig) -> bool:
    return _http_ok(f"{cfg.prefect_api_url}/health").strip() == b"true"


def _mlflow_healthy(cfg: StackConfig) -> bool:
    return _http_ok(f"{cfg.mlflow_url}/health").strip() == b"OK"


def _ray_get(cfg: StackConfig, path: str) -> bytes:
    """GET ``path`` of the head's dashboard with the stack's token (b"" until it has one)."""
    if not cfg.ray_token_path.exists():
        return b""
    token = cfg.ray_token_path.read_text().strip()
    return _http_ok(f"{cfg.ray_dashboard_url}{path}", {"Authorization": f"Bearer {token}"})


def _ray_healthy(cfg: StackConfig) -> bool:
    return b"ray_version" in _ray_get(cfg, "/api/version")


def _ray_node_healthy(cfg: StackConfig) -> bool:
    """The head lists an ALIVE node that has :data:`RAY_NODE_RESOURCE` (the state API)."""
    body = _ray_get(cfg, "/api/v0/nodes?detail=1&limit=100")
    nodes = json.loads(body)["data"]["result"]["result"] if body else []
    return any(
        node["state"] == "ALIVE" and RAY_NODE_RESOURCE in node["resources_total"] for node in nodes
    )


def _worker_healthy(cfg: StackConfig) -> bool:
    """The worker counts as up once the server lists it ONLINE in the pool (it heartbeats)."""
    url = f"{cfg.prefect_api_url}/work_pools/{cfg.work_pool}/workers/filter"
    body = _http_ok(url, {"Content-Type": "application/json"}, b"{}")
    workers = json.loads(body) if body else []
    return any(w.get("name") == WORKER_NAME and w.get("status") == "ONLINE" for w in workers)


# --- PostgreSQL: the team setup's store, as the compose file has it (the same user, databases
# and URL schemes: tests/unit/infra/local/test_stack.py checks the two agree). Debian's
# `postgresql` package provides the binaries. PostgreSQL refuses to run as root: there it runs as
# the package's `postgres` user, in a directory that user can reach.

POSTGRES_USER = "elmo"  # compose's ${POSTGRES_USER} in infra/compose/.env.example
POSTGRES_DATABASES = ("prefect", "mlflow")  # compose: POSTGRES_DB, then postgres-init.sql
POSTGRES_SYSTEM_USER = "postgres"  # Debian's, for a root caller


def postgres_binary(name: str) -> str:
    """``name`` from PATH, else from Debian's newest ``/usr/lib/postgresql/<major>/bin``."""
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise StackError(
            f"PostgreSQL's {name} is not installed: apt-get install postgresql (Debian's package)"
        )
    return found


def _as_postgres_owner(command: list[str]) -> list[str]:
    """``command`` as the cluster's owner: the caller, or for root Debian's ``postgres`` user."""
    return ["runuser", "-u", POSTGRES_SYSTEM_USER, "--", *command] if os.geteuid() == 0 else command


def postgres_data_dir(state_dir: Path) -> Path:
    """The cluster's directory: under the stack's state, or for root (whose home the ``postgres``
    user cannot enter) a ``/tmp`` directory named after that state."""
    if os.geteuid() != 0:
        return state_dir / "postgres"
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"elmo-postgres-{digest}"


def postgres_password(state_dir: Path) -> str:
    """The cluster's password, generated once into the stack's state."""
    return _secret(state_dir / "postgres_password", lambda: secrets.token_urlsafe(24))


def _secret(path: Path, make: Callable[[], str]) -> str:
    """``path``'s secret, made by ``make`` and written whole (mode 600) the first time."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(make())
        partial.replace(path)
    return path.read_text().strip()


MLFLOW_DRIVER = "postgresql+psycopg2"  # MLflow's plain postgresql:// asks for psycopg 3
PREFECT_DRIVER = "postgresql+asyncpg"


def _postgres_url(host: str, port: int, database: str, state_dir: Path, driver: str) -> str:
    """The database's SQLAlchemy URL: :data:`MLFLOW_DRIVER` for MLflow, :data:`PREFECT_DRIVER` for
    Prefect."""
    return f"{driver}://{POSTGRES_USER}:{postgres_password(state_dir)}@{host}:{port}/{database}"


def _ensure_cluster(state_dir: Path) -> Path:
    """The cluster's directory, made by ``initdb`` the first time (a half-made one is removed
    first: ``PG_VERSION`` is written last)."""
    directory = postgres_data_dir(state_dir)
    if (directory / "PG_VERSION").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700, parents=True)
    secret = postgres_password(state_dir)
    with tempfile.NamedTemporaryFile("w", dir=directory.parent, delete=False) as handle:
        handle.write(secret)
    pwfile = Path(handle.name)
    try:
        if os.geteuid() == 0:
            shutil.chown(directory, POSTGRES_SYSTEM_USER, POSTGRES_SYSTEM_USER)
            shutil.chown(pwfile, POSTGRES_SYSTEM_USER, POSTGRES_SYSTEM_USER)
        command = [
            postgres_binary("initdb"), "-D", str(directory), "-U", POSTGRES_USER,
            f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8",
        ]  # fmt: skip
        made = subprocess.run(
            _as_postgres_owner(command), capture_output=True, text=True, check=False
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if made.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise StackError(f"initdb failed in {directory}:\n{made.stdout[-2000:]}{made.stderr}")
    return directory


def _postgres_command(state_dir: Path, host: str, port: int) -> list[str]:
    """``postgres`` in the foreground on ``host:port``, its Unix socket in its own directory."""
    directory = _ensure_cluster(state_dir)
    server = [postgres_binary("postgres"), "-D", str(directory), "-h", host, "-p", str(port)]
    return _as_postgres_owner([*server, "-k", str(directory)])


def _postgres_ready(host: str, port: int) -> bool:
    """Whether the server accepts connections (``pg_isready``; no password needed)."""
    probe = [
        postgres_binary("pg_isready"), "-h", host, "-p", str(port),
        "-U", POSTGRES_USER, "-d", "postgres",
    ]  # fmt: skip
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def _ensure_databases(host: str, port: int, state_dir: Path) -> None:
    """Create :data:`POSTGRES_DATABASES` where missing."""
    import psycopg2  # the MLflow server's driver: only the PostgreSQL stack needs it

    try:
        connection = psycopg2.connect(
            host=host, port=port, user=POSTGRES_USER, password=postgres_password(state_dir),
            dbname="postgres", connect_timeout=5,
        )  # fmt: skip
    except psycopg2.Error as error:
        raise StackError(f"PostgreSQL on {host}:{port} refused the stack: {error}") from None
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            for database in POSTGRES_DATABASES:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{database}"')
    finally:
        connection.close()


# MLflow's server runs its GenAI jobs (scorers, prompt optimisation, trace roll-ups) in eight
# processes of its own, which the pipeline never submits: off, its server is two processes, not ten,
# and holds a fifth of the memory (benchmarks/results/suite_slow-2026-11-30.md).
MLFLOW_JOBS = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def _mlflow_command(cfg: StackConfig) -> list[str]:
    store = (
        cfg.database_url("mlflow", MLFLOW_DRIVER)
        if cfg.on_postgres
        else f"sqlite:///{cfg.home / 'mlflow.db'}"
    )
    return [
        _bin("mlflow"), "server",
        "--backend-store-uri", store,
        "--serve-artifacts",
        "--artifacts-destination", (cfg.home / "mlartifacts").as_uri(),
        "--host", cfg.host,
        "--port", str(cfg.mlflow_port),
        "--workers", str(cfg.mlflow_workers),
    ]  # fmt: skip


def _seed_prefect_database(cfg: StackConfig) -> None:
    """On SQLite, the server's first start from a migrated database (flows/prefect_database.py)."""
    if not cfg.on_postgres:
        seed_database(cfg.state_dir / "prefect")  # _service_env's PREFECT_HOME


def _prefect_command(cfg: StackConfig) -> list[str]:
    return [_bin("prefect"), "server", "start", "--host", cfg.host, "--port", str(cfg.prefect_port)]


def _worker_command(cfg: StackConfig) -> list[str]:
    return [
        _bin("prefect"), "worker", "start",
        "--pool", cfg.work_pool, "--type", "process", "--name", WORKER_NAME,
        "--create-pool-if-not-found",
    ]  # fmt: skip


def _ray_command(cfg: StackConfig) -> list[str]:
    command = [
        _bin("ray"), "start", "--head",
        "--port", str(cfg.ray_port),
        "--dashboard-host", cfg.host,
        "--dashboard-port", str(cfg.ray_dashboard_port),
        "--ray-client-server-port", str(cfg.ray_client_port),
        "--dashboard-agent-listen-port", str(cfg.ray_agent_port),
        "--temp-dir", str(cfg.ray_temp_dir),
        "--include-dashboard", "true",
        "--disable-usage-stats",
    ]  # fmt: skip
    if cfg.ray_num_cpus is not None:
        command += ["--num-cpus", str(cfg.ray_num_cpus)]
    return command


def _ray_node_command(cfg: StackConfig) -> list[str]:
    """A second node joined to the head, on this machine: its own agent port, every other port
    left for Ray to choose; the head's temp dir and token."""
    command = [
        _bin("ray"), "start",
        "--address", f"{cfg.host}:{cfg.ray_port}",
        "--dashboard-agent-listen-port", str(cfg.ray_node_agent_port),
        "--resources", json.dumps({RAY_NODE_RESOURCE: 1}),
        "--disable-usage-stats",
    ]  # fmt: skip
    if cfg.ray_num_cpus is not None:
        command += ["--num-cpus", str(cfg.ray_num_cpus)]
    return command


SERVICES: dict[str, Service] = {
    "postgres": Service(
        "postgres",
        lambda c: _postgres_command(c.state_dir, c.host, c.postgres_port),
        lambda c: _postgres_ready(c.host, c.postgres_port),
        lambda c: {"ELMO_POSTGRES_PORT": c.postgres_port},
        after_start=lambda c: _ensure_databases(c.host, c.postgres_port, c.state_dir),
    ),
    "mlflow": Service(
        "mlflow",
        _mlflow_command,
        _mlflow_healthy,
        lambda c: {"ELMO_MLFLOW_PORT": c.mlflow_port},
        needs_database=True,
    ),
    "prefect": Service(
        "prefect",
        _prefect_command,
        _prefect_healthy,
        lambda c: {"ELMO_PREFECT_PORT": c.prefect_port},
        needs_database=True,
        before_launch=_seed_prefect_database,
    ),
    "ray": Service(
        "ray",
        _ray_command,
        _ray_healthy,
        lambda c: {"ELMO_RAY_PORT": c.ray_port, "ELMO_RAY_DASHBOARD_PORT": c.ray_dashboard_port},
        daemonizes=True,
        transient_failure=RAY_STARTUP_TIMEOUT,
    ),
    "ray-node": Service(
        "ray-node",
        _ray_node_command,
        _ray_node_healthy,
        lambda c: {"ELMO_RAY_NODE_AGENT_PORT": c.ray_node_agent_port},
        needs=("ray",),
        daemonizes=True,
        transient_failure=RAY_STARTUP_TIMEOUT,
    ),
    "worker": Service("worker", _worker_command, _worker_healthy, lambda c: {}, needs=("prefect",)),
}


def session_processes(session_id: int) -> list[int]:
    """Live (non-zombie) processes whose session is ``session_id``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp session ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session_id:
            found.append(int(entry.name))
    return sorted(found)


def _pid_file(cfg: StackConfig, name: str) -> Path:
    return cfg.state_dir / "pids" / f"{name}.pid"


def _log_file(cfg: StackConfig, name: str) -> Path:
    return cfg.state_dir / "logs" / f"{name}.log"


def recorded_session(cfg: StackConfig, name: str) -> int | None:
    path = _pid_file(cfg, name)
    return int(path.read_text()) if path.exists() else None


def _log_tail(cfg: StackConfig, name: str) -> str:
    lines = _log_file(cfg, name).read_text(errors="replace").splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _ensure_ray_token(cfg: StackConfig) -> None:
    _secret(cfg.ray_token_path, lambda: secrets.token_hex(32))


def _service_env(cfg: StackConfig) -> dict[str, str]:
    """The caller's environment, this venv first on PATH, the stack's client variables, and
    Prefect's own state under ELMO_HOME."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(cfg.client_env())
    env["PREFECT_HOME"] = str(cfg.state_dir / "prefect")
    if cfg.on_postgres:  # the server's store; clients go through PREFECT_API_URL
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = cfg.database_url("prefect", PREFECT_DRIVER)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env[MLFLOW_JOBS] = "false"
    return env


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex((host, port)) == 0


def _spawn(cfg: StackConfig, service: Service) -> subprocess.Popen[bytes]:
    """Launch ``service`` in a new session, its output appended to its log; record the session."""
    for variable, port in service.ports(cfg).items():
        if _port_taken(cfg.host, port):
            raise StackError(
                f"{service.name}: port {port} is in use by another program; set {variable}"
            )
    if service.before_launch is not None:
        service.before_launch(cfg)
    log_path = _log_file(cfg, service.name)
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {service.name}\n".encode())
        log.flush()
        process = subprocess.Popen(
            service.command(cfg),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_service_env(cfg),
            cwd=cfg.home,
            start_new_session=True,
        )
    _pid_file(cfg, service.name).write_text(str(process.pid))
    return process


def _wait_healthy(cfg: StackConfig, service: Service, process: subprocess.Popen[bytes]) -> None:
    """Return once ``service`` answers its health check; on failure stop it and show its log."""
    deadline = time.monotonic() + cfg.timeout_s
    while time.monotonic() < deadline:
        code = process.poll()
        # A daemonizing launcher counts only once it exited cleanly: Ray's dashboard may answer
        # while `ray start` is still failing on the raylet.
        if (code == 0 or not service.daemonizes) and service.healthy(cfg):
            return
        if code is not None and (code != 0 or not service.daemonizes):
            stop_services(cfg, [service.name])
            raise StackError(
                f"{service.name} exited with code {code}; log tail:\n{_log_tail(cfg, service.name)}"
            )
        time.sleep(0.5)
    stop_services(cfg, [service.name])
    raise StackError(
        f"{service.name} not healthy after {cfg.timeout_s:.0f} s; "
        f"log tail:\n{_log_tail(cfg, service.name)}"
    )


def _wait_healthy_or_relaunch(
    cfg: StackConfig, service: Service, process: subprocess.Popen[bytes]
) -> None:
    """:func:`_wait_healthy`, with one more launch for a service whose log shows its
    ``transient_failure``: `ray start` gives its raylet a fixed 30 s to register, which a core
    shared with the other servers starting beside it can miss. By the second launch its wave's
    other servers are up. Any other failure is reported at once."""
    try:
        _wait_healthy(cfg, service, process)
    except StackError as failed:
        if service.transient_failure is None or service.transient_failure not in str(failed):
            raise
        reason = str(failed).partition("; log tail:")[0]
        _say(f"{service.name}: {reason}; launching it once more")
        _wait_healthy(cfg, service, _spawn(cfg, service))


def start(cfg: StackConfig, names: list[str]) -> dict[str, float]:
    """Start the services in ``names`` that are not already healthy; seconds each took.

    Services start side by side in waves, each after the services it needs: PostgreSQL first
    where the servers store there, the worker once Prefect is up. A service whose session is
    alive but unhealthy is stopped and started again.
    """
    for sub in ("logs", "pids"):
        (cfg.state_dir / sub).mkdir(parents=True, exist_ok=True)
    _ensure_ray_token(cfg)
    timings: dict[str, float] = {}
    depth: dict[str, int] = {}
    for name in SERVICE_ORDER:  # each after everything it needs
        needs = SERVICES[name].prerequisites(cfg)
        depth[name] = 1 + max((depth[need] for need in needs), default=-1)
    for level in sorted({depth[name] for name in names}):
        launched = {}
        for name in (n for n in names if depth[n] == level):
            service = SERVICES[name]
            for need in service.prerequisites(cfg):
                if not SERVICES[need].healthy(cfg):
                    raise StackError(f"{name} needs {need}, which is not running")
            if service.healthy(cfg) and _is_ours(cfg, name):
                _say(f"{name}: already running")
                if service.after_start is not None:
                    service.after_start(cfg)
                continue
            stop_services(cfg, [name])
            launched[name] = (time.monotonic(), _spawn(cfg, service))
        for name, (spawned, process) in launched.items():
            _wait_healthy_or_relaunch(cfg, SERVICES[name], process)
            if SERVICES[name].after_start is not None:
                SERVICES[name].after_start(cfg)
            timings[name] = time.monotonic() - spawned
            _say(f"{name}: healthy {timings[name]:.1f} s after launch")
    _write_env_file(cfg)
    return timings


def _is_ours(cfg: StackConfig, name: str) -> bool:
    session = recorded_session(cfg, name)
    return session is not None and bool(session_processes(session))


def stop_services(cfg: StackConfig, names: list[str]) -> None:
    """End every process of the services' sessions: SIGTERM, a grace period, then SIGKILL.

    All sessions are signalled together so their grace periods overlap.
    """
    sessions = {name: recorded_session(cfg, name) for name in names}
    live = {name: session for name, session in sessions.items() if session is not None}

    def remaining() -> list[int]:
        return [pid for session in live.values() for pid in session_processes(session)]

    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        for pid in remaining():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while remaining() and time.monotonic() < deadline:
            time.sleep(0.2)
    left = remaining()
    if left:
        raise StackError(f"processes {left} of {sorted(live)} survived SIGKILL")
    for name in live:
        _pid_file(cfg, name).unlink()


def stop(cfg: StackConfig, names: list[str]) -> None:
    """Stop the services; every process of their sessions is gone when this returns."""
    stop_services(cfg, names)
    for name in names:
        _say(f"{name}: stopped")


def status(cfg: StackConfig, names: list[str]) -> bool:
    """Print one line per service; True when all of them are healthy."""
    all_healthy = True
    for name in names:
        session = recorded_session(cfg, name)
        processes = session_processes(session) if session is not None else []
        healthy = SERVICES[name].healthy(cfg)
        all_healthy &= healthy
        state = "healthy" if healthy else ("unhealthy" if processes else "stopped")
        _say(f"{name:8} {state:9} session={session} processes={len(processes)}")
    return all_healthy


def _exports(cfg: StackConfig) -> str:
    return "".join(f"export {key}={value}\n" for key, value in cfg.client_env().items())


def _write_env_file(cfg: StackConfig) -> None:
    (cfg.state_dir / "env.sh").write_text(_exports(cfg))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parse_services(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(SERVICES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown services {unknown}; choose from {SERVICE_ORDER}")
    return [name for name in SERVICE_ORDER if name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument("--services", type=_parse_services, help="default: all of the stack's")
    args = parser.parse_args(argv)
    try:
        cfg = StackConfig.from_env()
        services = args.services or cfg.services
        if args.action == "start":
            start(cfg, services)
        elif args.action == "stop":
            stop(cfg, list(reversed(services)))
            return 0
        elif not status(cfg, services):
            return 1
    except StackError as error:
        _say(f"error: {error}")
        return 1
    print(_exports(cfg), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
