"""The local stack's PostgreSQL: one cluster for the MLflow and Prefect servers, as the compose
file's team setup has (the same user, databases and URL schemes: ``test_stack_postgres.py``
checks the two agree).

Debian's ``postgresql`` package provides the binaries (``apt-get install postgresql``). The
cluster is created under the stack's state, owned by whoever runs the stack, with a generated
password and scram authentication, and listens on 127.0.0.1 only. PostgreSQL refuses to run as
root: there it runs as the package's ``postgres`` user, in a directory that user can reach.
"""

from __future__ import annotations

import glob
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

USER = "elmo"  # compose's ${POSTGRES_USER} in infra/compose/.env.example
DATABASES = ("prefect", "mlflow")  # compose: POSTGRES_DB, then postgres-init.sql
SYSTEM_USER = "postgres"  # Debian's, for a root caller


class PostgresError(RuntimeError):
    """PostgreSQL is missing, or its cluster could not be made or reached; says which."""


def binary(name: str) -> str:
    """``name`` from PATH, else from Debian's newest ``/usr/lib/postgresql/<major>/bin``."""
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise PostgresError(
            f"PostgreSQL's {name} is not installed: apt-get install postgresql (Debian's package)"
        )
    return found


def as_owner(command: list[str]) -> list[str]:
    """``command`` as the cluster's owner: the caller, or for root Debian's ``postgres`` user."""
    return ["runuser", "-u", SYSTEM_USER, "--", *command] if os.geteuid() == 0 else command


def data_dir(state_dir: Path) -> Path:
    """The cluster's directory: under the stack's state, or for root (whose home the ``postgres``
    user cannot enter) a ``/tmp`` directory named after that state."""
    if os.geteuid() != 0:
        return state_dir / "postgres"
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"elmo-postgres-{digest}"


def password(state_dir: Path) -> str:
    """The cluster's password, generated once into the stack's state (mode 600)."""
    path = state_dir / "postgres_password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24))
        partial.replace(path)
    return path.read_text().strip()


MLFLOW_DRIVER = "postgresql+psycopg2"  # MLflow's plain postgresql:// asks for psycopg 3
PREFECT_DRIVER = "postgresql+asyncpg"


def url(host: str, port: int, database: str, state_dir: Path, driver: str) -> str:
    """The database's SQLAlchemy URL: :data:`MLFLOW_DRIVER` for MLflow, :data:`PREFECT_DRIVER` for
    Prefect."""
    return f"{driver}://{USER}:{password(state_dir)}@{host}:{port}/{database}"


def ensure_cluster(state_dir: Path) -> Path:
    """The cluster's directory, made by ``initdb`` the first time (a half-made one is removed
    first: ``PG_VERSION`` is written last)."""
    directory = data_dir(state_dir)
    if (directory / "PG_VERSION").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700, parents=True)
    secret = password(state_dir)
    with tempfile.NamedTemporaryFile("w", dir=directory.parent, delete=False) as handle:
        handle.write(secret)
    pwfile = Path(handle.name)
    try:
        if os.geteuid() == 0:
            shutil.chown(directory, SYSTEM_USER, SYSTEM_USER)
            shutil.chown(pwfile, SYSTEM_USER, SYSTEM_USER)
        command = [binary("initdb"), "-D", str(directory), "-U", USER, f"--pwfile={pwfile}"]
        command += ["--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"]
        made = subprocess.run(as_owner(command), capture_output=True, text=True, check=False)
    finally:
        pwfile.unlink(missing_ok=True)
    if made.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise PostgresError(f"initdb failed in {directory}:\n{made.stdout[-2000:]}{made.stderr}")
    return directory


def server_command(state_dir: Path, host: str, port: int) -> list[str]:
    """``postgres`` in the foreground on ``host:port``, its Unix socket in its own directory."""
    directory = ensure_cluster(state_dir)
    server = [binary("postgres"), "-D", str(directory), "-h", host, "-p", str(port)]
    return as_owner([*server, "-k", str(directory)])


def ready(host: str, port: int) -> bool:
    """Whether the server accepts connections (``pg_isready``; no password needed)."""
    probe = [binary("pg_isready"), "-h", host, "-p", str(port), "-U", USER, "-d", "postgres"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def ensure_databases(host: str, port: int, state_dir: Path) -> None:
    """Create :data:`DATABASES` where missing."""
    import psycopg2  # the MLflow server's driver: only the PostgreSQL stack needs it

    try:
        connection = psycopg2.connect(
            host=host, port=port, user=USER, password=password(state_dir), dbname="postgres",
            connect_timeout=5,
        )  # fmt: skip
    except psycopg2.Error as error:
        raise PostgresError(f"PostgreSQL on {host}:{port} refused the stack: {error}") from None
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            for database in DATABASES:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{database}"')
    finally:
        connection.close()
