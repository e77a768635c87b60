"""The local stack (infra/local/stack.py) refusing to half-start: a service that fails shows its
log and leaves no process behind. A stack that starts, serves and stops is test_end_to_end.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(tmp_path: Path, local_stack) -> Iterator[Any]:
    with local_stack(
        tmp_path / "elmo", ELMO_RAY_NUM_CPUS="1", ELMO_STACK_TIMEOUT_S="200"
    ) as not_started:
        yield not_started


def test_failed_start_shows_the_service_log_and_leaves_nothing(stack) -> None:
    stack.env["ELMO_RAY_NUM_CPUS"] = "-1"  # `ray start` launches the GCS, then fails

    result = stack.run("start", "--services", "ray")

    assert result.returncode == 1
    assert "ray exited with code 1; log tail:" in result.stderr
    assert "Resource quantities must be nonnegative" in result.stderr
    # The pid file goes only once every process of the session is gone.
    assert not (Path(stack.env["ELMO_HOME"]) / "stack" / "pids" / "ray.pid").exists()
