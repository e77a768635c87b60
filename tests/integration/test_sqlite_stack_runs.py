"""The team stack's first two checks (test_team_pipeline.py), one flow run and then three at once,
on the one-machine stack, where MLflow and Prefect each store in a SQLite file: what a user who
skips PostgreSQL gets when several flow runs share the servers, and the two stacks' times. The
runs hold there too: a write SQLite refuses as "database is locked" fails one request, which the
client retries (the count is printed; benchmarks/results/team_stack-2026-11-28.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.integration.deployments import (
    ONE_CPU,
    deploy_smoke,
    lock_errors,
    shorter_smoke,
    three_at_once,
    two_one_cpu_nodes,
    user_shell,
    watch_smoke,
)

pytestmark = [pytest.mark.integration, pytest.mark.team_stack]  # make test-team-stack


@pytest.fixture(scope="module")
def sqlite_stack(
    tmp_path_factory: pytest.TempPathFactory, local_stack, free_port
) -> Iterator[dict[str, str]]:
    """The SQLite stack with the team stack's Ray (a head and a second node, one CPU each)."""
    home = tmp_path_factory.mktemp("sqlite") / "elmo"
    with user_shell(local_stack, home, **two_one_cpu_nodes(free_port)) as env:
        deploy_smoke(env)
        yield env


@pytest.mark.timeout(1800)
def test_one_flow_run_then_three_at_once_on_sqlite_keep_their_runs_and_versions(
    sqlite_stack: dict[str, str],
) -> None:
    began = time.monotonic()
    watch_smoke(sqlite_stack, shorter_smoke(ONE_CPU, num_workers=2))
    print(f"one flow run on the SQLite stack: {time.monotonic() - began:.0f} s")
    seconds = three_at_once(sqlite_stack, seeds=(11, 12, 13))
    locked = lock_errors(sqlite_stack)
    print(f"three flow runs at once on the SQLite stack: {seconds:.0f} s, lock errors {locked}")
