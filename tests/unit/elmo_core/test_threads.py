"""A process's torch threads: its share of the cores, fewer while the machine is oversubscribed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from elmo_core import threads


@pytest.mark.parametrize(
    ("cpus", "load", "share", "expected"),
    [
        (2, 0.1, 2, 2),  # idle: the whole share
        (2, 1.6, 2, 2),  # busy, not oversubscribed: still the share
        (2, 2.0, 2, 2),  # as many runnable as cores: the cores' share of them
        (2, 7.0, 2, 1),  # far oversubscribed: never fewer than one
        (16, 32.0, 8, 4),
    ],
)
def test_threads_are_cut_only_while_the_cores_are_oversubscribed(
    monkeypatch: pytest.MonkeyPatch, cpus: int, load: float, share: int, expected: int
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(threads, "_runnable_elsewhere", lambda: 0)

    assert threads.threads_under_load(share) == expected


def test_a_block_runs_with_fewer_threads_under_load_and_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    monkeypatch.setattr(threads, "_runnable_elsewhere", lambda: 0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.fewer_threads_under_load() as inside:
            assert inside == torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_load_that_began_seconds_ago_cuts_threads_before_the_average_sees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.2, 0.2, 0.2))
    monkeypatch.setattr(threads, "_runnable_elsewhere", lambda: 6)

    assert threads.threads_under_load(2) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_busy_processes_beside_this_one_are_counted_as_runnable_now() -> None:
    spin = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
    quiet = threads._runnable_elsewhere()
    assert quiet is not None
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(4)]
    try:
        time.sleep(0.3)  # past their start-up
        loaded = threads.other_load()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    assert loaded >= 3
