"""A new Prefect home's SQLite database, copied from an empty one Prefect has already migrated.

Prefect's server creates its database on its first start by running every migration since its
first release, which costs as much CPU as `make run`'s prepare stage. Each ELMO_HOME (a user's
second project, each test's) starts a server on a home of its own. So the migrated, empty
database is built once per Prefect version in the user's cache directory, and a new home starts
from a copy of it: the server then finds nothing to migrate. Figures:
benchmarks/results/suite_slow-2026-11-30.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

DATABASE_FILE = "prefect.db"  # where Prefect's default connection URL puts it in PREFECT_HOME
# Prefect's own server code, in a process of its own, migrates an empty file to the newest schema.
MIGRATE = (
    "import asyncio\n"
    "from prefect.server.database import provide_database_interface\n"
    "asyncio.run(provide_database_interface().create_db())\n"
)


def cache_dir() -> Path:
    """Where migrated databases are kept: ``$XDG_CACHE_HOME/elmo/prefect``, else ``~/.cache``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "elmo" / "prefect"


def seed_database(prefect_home: Path) -> None:
    """Give ``prefect_home`` a migrated, empty database unless it has one; the first call for a
    Prefect version migrates one (as the server's first start would have)."""
    target = prefect_home / DATABASE_FILE
    if target.exists():
        return
    prefect_home.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{DATABASE_FILE}.part")
    shutil.copyfile(_migrated(), partial)
    os.replace(partial, target)  # whole or absent: a crash here leaves the server to migrate


def _migrated() -> Path:
    """The migrated, empty database of this Prefect version, built if missing. Two processes
    that build it at once each build their own; the first one kept stays."""
    kept = cache_dir() / f"prefect-{version('prefect')}.db"
    if kept.exists():
        return kept
    kept.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=kept.parent) as scratch:
        built, single = Path(scratch) / DATABASE_FILE, Path(scratch) / "single.db"
        env = {**os.environ, "PREFECT_HOME": scratch}
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{built}"
        env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)  # the older name of the same
        done = subprocess.run(
            [sys.executable, "-c", MIGRATE], env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrating a Prefect database failed:\n{done.stderr[-3000:]}")
        with contextlib.closing(sqlite3.connect(built)) as connection:
            connection.execute("VACUUM INTO ?", (str(single),))  # one file, WAL's pages in it
        with contextlib.suppress(FileExistsError):  # kept whole, never replaced
            os.link(single, kept)
    return kept
