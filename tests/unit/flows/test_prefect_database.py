"""A new Prefect home starts from a database already migrated to Prefect's newest schema, built
once per Prefect version in the user's cache and copied."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import prefect.server.database
from alembic.script import ScriptDirectory
from prefect import __version__

from flows.prefect_database import DATABASE_FILE, cache_dir, seed_database

MIGRATIONS = Path(prefect.server.database.__file__).parent / "_migrations"


def _newest_sqlite_revision() -> str | None:
    scripts = ScriptDirectory(
        str(MIGRATIONS), version_locations=[str(MIGRATIONS / "versions/sqlite")]
    )
    return scripts.get_current_head()


def test_new_homes_get_copies_of_one_database_at_prefects_newest_schema(tmp_path: Path) -> None:
    seed_database(tmp_path / "first")
    kept = cache_dir() / f"prefect-{__version__}.db"
    built = kept.stat().st_mtime_ns
    seed_database(tmp_path / "second")

    first, second = (tmp_path / home / DATABASE_FILE for home in ("first", "second"))
    assert first.read_bytes() == second.read_bytes() == kept.read_bytes()
    assert kept.stat().st_mtime_ns == built  # copied, not migrated again
    with contextlib.closing(sqlite3.connect(first)) as database:
        tables = {row[0] for row in database.execute("SELECT name FROM sqlite_master")}
        revisions = database.execute("SELECT version_num FROM alembic_version").fetchall()
        runs = database.execute("SELECT count(*) FROM flow_run").fetchone()
    assert {"flow_run", "deployment", "work_pool"} <= tables
    assert revisions == [(_newest_sqlite_revision(),)] and runs == (0,)
    assert not list(tmp_path.glob("*/.*.part"))  # nothing half-written


def test_a_home_with_a_database_keeps_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / DATABASE_FILE).write_bytes(b"the user's")
    seed_database(home)
    assert (home / DATABASE_FILE).read_bytes() == b"the user's"
