"""Torch's intra-op threads in a process: its share of the cores, fewer while the machine is busy.

Threads that meet at a barrier after every op wait for whichever one the scheduler set aside, so
on an oversubscribed machine more threads are slower. The load counted is the larger of the last
minute's average and the work runnable now, so a load that began seconds ago counts too.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

SAMPLES, SAMPLE_GAP_S = 5, 0.01


def threads_under_load(share: int) -> int:
    """``share`` threads, or while the load is at or over the core count, that share of the cores
    it leaves (at least 1). Called as a process starts work: the load it sees is other work's."""
    cpus, load = os.cpu_count() or 1, other_load()
    if load < cpus:
        return share
    return max(1, math.floor(share * cpus / load))


def other_load() -> float:
    """The larger of the 1-minute load average and the median of a few samples of the threads
    other processes have runnable now (Linux; elsewhere the average alone)."""
    samples = []
    for index in range(SAMPLES):
        if index:
            time.sleep(SAMPLE_GAP_S)
        runnable = _runnable_elsewhere()
        if runnable is None:
            break
        samples.append(runnable)
    now = statistics.median(samples) if samples else 0.0
    return max(os.getloadavg()[0], now)


def _runnable_elsewhere() -> int | None:
    """The system's runnable threads less this process' own (its spinning OpenMP threads are not
    competition), or None where ``/proc`` does not say."""
    try:
        stat = Path("/proc/stat").read_text(encoding="ascii")
        lines = stat.splitlines()
        running = next(int(line.split()[1]) for line in lines if line.startswith("procs_running"))
    except (OSError, StopIteration, ValueError):
        return None
    own = 0
    for task in Path("/proc/self/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            own += task.read_text(encoding="ascii").rsplit(")", 1)[1].split()[0] == "R"
    return max(0, running - own)


@contextlib.contextmanager
def fewer_threads_under_load() -> Iterator[int]:
    """Torch's threads cut by :func:`threads_under_load` for a block, then restored: for work that
    runs in a process which goes on to other things (the driver evaluating, a local run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads_under_load(before))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
