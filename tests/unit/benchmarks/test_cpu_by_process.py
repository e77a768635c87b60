"""The CPU-by-kind sampler: each kind read from a command line, and a real command's CPU found."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cpu_by_process

REPO = Path(__file__).resolve().parents[3]
VENV = "/r/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("cmdline", "name", "expected"),
    [
        (f"/r/.venv/bin/python {VENV}/ray/_private/workers/setup_worker.py {VENV}/ray/_private/"
         "workers/default_worker.py --node-ip-address=1", "python",
         "Ray worker (a job's runtime env)"),
        (f"/r/.venv/bin/python {VENV}/ray/_private/workers/default_worker.py --x", "python",
         "Ray worker"),
        ("ray::TrainController.__init__", "ray::TrainContr", "Ray worker"),
        (f"{VENV}/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/s", "raylet",
         "Ray daemons"),
        (f"/r/.venv/bin/python {VENV}/ray/dashboard/agent.py --x", "python", "Ray daemons"),
        ("/r/.venv/bin/python -m uvicorn --app-dir /x prefect.server.api.server:create_app",
         "python", "Prefect"),
        ("/r/.venv/bin/python -m huey.bin.huey_consumer mlflow.server.jobs", "python", "MLflow"),
        ("/r/.venv/bin/python -m pytest -q -n 2", "python", "pytest"),
        ("/r/.venv/bin/python -m flows.run_local --max-steps 8", "python",
         "python -m flows.run_local"),
        ("", "kdamond.0", "kdamond.0"),  # a kernel thread: no command line
    ],
)  # fmt: skip
def test_each_process_is_told_by_its_command_line(cmdline: str, name: str, expected: str) -> None:
    assert cpu_by_process.kind(cmdline, name) == expected


def test_a_busy_command_is_found_with_its_cpu_and_the_last_line_is_json() -> None:
    busy = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu_by_process", "--interval", "0.1", "--",
         sys.executable, "-c", busy],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "cpu_by_process" and summary["returncode"] == 0
    mine = summary["cpu_s"][Path(sys.executable).name[:15]]  # `python -c`: no module, its name
    assert mine >= 0.5
    assert summary["busy_cpu_s"] >= mine - 0.1
    assert summary["wall_s"] >= 0.6
