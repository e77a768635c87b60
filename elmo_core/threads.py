"""Torch's intra-op threads in a process: its share of the cores, fewer while the machine is
oversubscribed.

Threads that meet at a barrier after every operation wait for whichever one the scheduler has set
aside, so beside more runnable work than cores (a loaded laptop, a shared node) more threads are
slower: on 2 cores at load 4-7 the ``ptb-small`` step ran 0.29-0.96x as fast with 2 threads as
with 1. OpenMP's spinning at those barriers is part of it, but ``OMP_WAIT_POLICY=PASSIVE`` is no
fix: 0.67-1.21x of 1 thread under load, and 0.71-1.19x of the default idle. Figures:
``benchmarks/results/bench_threads_under_load-2026-11-25.md``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import torch


def threads_under_load(share: int) -> int:
    """``share`` threads, or while the last minute's load average is at or over the core count,
    that share of the cores it leaves (at least 1). Called as a process starts: the load it sees
    is other work's."""
    cpus, load = os.cpu_count() or 1, os.getloadavg()[0]
    if load < cpus:
        return share
    return max(1, math.floor(share * cpus / load))


@contextlib.contextmanager
def fewer_threads_under_load() -> Iterator[int]:
    """Torch's threads cut by :func:`threads_under_load` for a block, then restored: for work that
    runs in a process which goes on to other things (the driver evaluating)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads_under_load(before))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
