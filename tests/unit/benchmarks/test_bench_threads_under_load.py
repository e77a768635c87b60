import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def bench():
    from benchmarks import bench_threads_under_load

    return bench_threads_under_load


@pytest.mark.parametrize("load", ["spin", "torch"])
def test_the_competing_load_ends_with_the_block_even_on_ctrl_c(bench, load):
    with pytest.raises(KeyboardInterrupt), bench.competing_load(2, load) as processes:
        assert all(process.poll() is None for process in processes)
        raise KeyboardInterrupt
    assert all(process.poll() is not None for process in processes)


def test_hogs_stop_on_their_own_once_the_benchmark_is_gone(bench):
    starter = (  # a benchmark that starts one hog, says its pid, and is then killed outright
        "import os, subprocess, sys, time\n"
        "hog = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())])\n"
        "print(hog.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter, bench.HOGS["spin"]], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    hog = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while _running(hog) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(hog)


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie left for its new parent to reap is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_each_setting_gets_its_own_wait_policy_not_the_callers(bench, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert "OMP_WAIT_POLICY" not in bench.child_env(None)
    assert bench.child_env("PASSIVE")["OMP_WAIT_POLICY"] == "PASSIVE"
