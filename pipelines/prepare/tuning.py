"""How a process that prepares is tuned: the worker processes and the command's own.

Prepare is a stream of large, short-lived NumPy and Arrow temporaries; the process-wide settings
here keep that cheap: a worker's share of the cores as Arrow threads, glibc keeping NumPy's freed
blocks (Arrow's tables stay in its own allocator), no pandas import, a frozen GC. They apply to the
worker processes (:mod:`pipelines.prepare.pool`, :mod:`pipelines.prepare.ray_pool`) and to the
``elmo prepare`` command's own process, never to a caller's (a flow's) that merely calls
:func:`pipelines.prepare.stage.prepare` in-process.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.abc
import os
import sys
from typing import Any

import pyarrow as pa

# glibc mallopt parameters (malloc.h) and the values prepare uses.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit: larger requests are always mapped
TRIM_THRESHOLD = 1 << 30  # free heap kept before glibc returns memory to the kernel


def cores_per_worker(workers: int) -> int:
    """A worker's share of the cores this process may run on (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) // workers)


def set_worker_threads(threads: int) -> None:
    """``threads`` Arrow compute threads (what a worker's kernels may use at once), one I/O."""
    pa.set_cpu_count(threads)
    pa.set_io_thread_count(1)


def keep_freed_memory() -> bool:
    """Let glibc serve blocks up to 32 MB from its heap and keep what is freed there.

    By default glibc maps each allocation over its (adaptive) threshold on its own and unmaps it
    on free, so a block's temporaries are page-faulted again for the next block. Returns
    whether the settings took (False off glibc, where nothing is changed).
    """
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None)  # the process's own symbols: the C library it runs on
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    applied = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
    return libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and applied


def keep_pandas_out() -> None:
    """Spare a process that only prepares the import of pandas.

    pyarrow imports pandas on its first ``pa.array`` call merely to ask whether the input is a
    pandas object; prepare never passes one. Failing the import for that one call makes pyarrow
    record "no pandas"; pandas stays importable afterwards (pyarrow retries when it needs it).
    """
    if "pandas" in sys.modules:
        return
    blocker = _ImportBlocker("pandas")
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)


class _ImportBlocker(importlib.abc.MetaPathFinder):
    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name:
            raise ModuleNotFoundError(f"{fullname} is not imported here", name=fullname)


def freeze_loaded_objects() -> None:
    """Move the objects that exist now (the imported modules') out of the garbage collector's
    reach: they live as long as the process, yet every full collection walks them, and so do
    the collections at interpreter exit, in a prepare command's serial time."""
    gc.freeze()


def tune_process(threads: int = 1) -> None:
    """Everything above, for a process that exists to run prepare with ``threads`` threads."""
    set_worker_threads(threads)
    keep_freed_memory()
    keep_pandas_out()
    freeze_loaded_objects()
