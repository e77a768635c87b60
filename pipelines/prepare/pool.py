"""Where prepare's tasks run (local processes or Ray tasks), and how those processes are tuned.

Tasks pass paths, not data. :func:`tune_process` tunes a worker or the ``elmo prepare`` process,
never a caller's (a flow's) that runs prepare in-process.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.abc
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from elmo_core.errors import DataError

T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

# glibc mallopt parameters (malloc.h) and the values prepare uses.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit: larger requests are always mapped
TRIM_THRESHOLD = 1 << 30  # free heap kept before glibc returns memory to the kernel


class LocalTaskPool:
    """``workers`` spawned processes (created on first use), each with its share of the cores
    for Arrow's threads (:func:`cores_per_worker`); or, when ``workers == 1``, this process,
    running as many tasks at once as it has cores, on threads: the tasks' time is in Arrow and
    NumPy kernels, which release the GIL. A worker holds a block of text per task it runs, so
    one worker on two cores peaks at about the memory of two worker processes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Any = None
        self._saved = (pa.cpu_count(), pa.io_thread_count())

    def __enter__(self) -> LocalTaskPool:
        if self.workers == 1:
            set_worker_threads(cores_per_worker(1))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
        pa.set_cpu_count(self._saved[0])
        pa.set_io_thread_count(self._saved[1])

    def imap(self, function: Callable[[T], R], tasks: Sequence[T]) -> Iterator[R]:
        """Results as they finish (any order)."""
        if self.workers == 1:
            return _on_threads(function, tasks, min(pa.cpu_count(), len(tasks)))
        if len(tasks) <= 1:
            return map(function, tasks)
        return self._processes().imap_unordered(function, tasks)

    def submit(self, function: Callable[[T], R], task: T) -> Pending[R]:
        """Run one task beside those of later :meth:`imap` calls (queued first); in-process
        with one worker, where it runs at once."""
        if self.workers == 1:
            return Done(function(task))
        return self._processes().apply_async(function, (task,))

    def _processes(self) -> Any:
        if self._pool is None:
            threads = (cores_per_worker(self.workers),)
            self._pool = _start_method().Pool(self.workers, tune_process, threads)
        return self._pool


def _on_threads(function: Callable[[T], R], tasks: Sequence[T], threads: int) -> Iterator[R]:
    """Results of ``threads`` threads as they finish; the tasks not started are dropped when
    the caller stops (an error)."""
    if threads <= 1:
        yield from map(function, tasks)
        return
    pool = ThreadPoolExecutor(threads)
    try:
        for done in as_completed([pool.submit(function, task) for task in tasks]):
            yield done.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class TaskPool(Protocol):
    """Where prepare's tasks run: :class:`LocalTaskPool` or :class:`RayTaskPool`."""

    def imap(self, function: Callable[[T], R], tasks: Sequence[T]) -> Iterator[R]: ...

    def submit(self, function: Callable[[T], R], task: T) -> Pending[R]: ...


def task_pool(executor: str, workers: int) -> AbstractContextManager[TaskPool]:
    """The pool of ``executor`` (``processes`` or ``ray``) with ``workers`` tasks at once."""
    if executor == "ray":
        return RayTaskPool(workers)
    return LocalTaskPool(workers)


class Pending(Protocol[R_co]):
    """A task's result to come (``multiprocessing``'s ``AsyncResult``, :class:`Done`, or a Ray
    task's)."""

    def get(self) -> R_co: ...


@dataclass(frozen=True)
class Done(Generic[R]):
    """A result already there."""

    value: R

    def get(self) -> R:
        return self.value


def _start_method() -> Any:
    """fork when this process runs no other Python thread, else forkserver.

    A forked worker starts at once with the parent's imports; a forkserver pays ~0.4 s to start
    and import before the first file, a tenth of a 200 MB corpus's time on two workers. But a
    fork copies any lock another thread holds at that instant (a flow process's event loop,
    logging), so a process with threads gets the forkserver. Arrow re-creates its own thread
    pools in a forked child.
    """
    import multiprocessing

    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["pipelines.prepare.inputs", "pipelines.prepare.encode"])
    return context


# --- on Ray ---------------------------------------------------------------------------------------


class RayTaskPool:
    """Prepare's task pool on Ray: at most ``workers`` tasks at once, or one per CPU of the
    cluster when ``workers`` is 1.

    Tasks pass paths, not data, so every node must see the corpus and the output at the same
    paths (a shared filesystem, or a single-node Ray); a remote output is staged under
    ``ELMO_HOME``, which several nodes must then share too. Only results travel through the
    object store: each file's type counts (a few MB) and the records of written shards.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.in_flight = workers
        self._remote: Any = None

    def __enter__(self) -> RayTaskPool:
        import ray

        from pipelines.common.ray_cluster import connect_ray

        connect_ray()
        if self.workers == 1:
            self.in_flight = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(run_on_node).options(num_cpus=1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._remote = None

    def imap(self, function: Callable[[T], R], tasks: Sequence[T]) -> Iterator[R]:
        """Results as they finish (any order); a task starts as soon as one finishes."""
        import ray

        from pipelines.common.ray_cluster import ray_get

        waiting = iter(tasks)
        running = [
            self._remote.remote(function, task)
            for task in itertools.islice(waiting, self.in_flight)
        ]
        try:
            while running:
                [finished], running = ray.wait(running, num_returns=1)
                running += [
                    self._remote.remote(function, task) for task in itertools.islice(waiting, 1)
                ]
                yield ray_get(finished)
        finally:
            for ref in running:
                ray.cancel(ref)

    def submit(self, function: Callable[[T], R], task: T) -> RayPending[R]:
        """Run one task beside those of later :meth:`imap` calls."""
        return RayPending(self._remote.remote(function, task))


class RayPending(Generic[R]):
    """A Ray task's result to come."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def get(self) -> R:
        from pipelines.common.ray_cluster import ray_get

        return ray_get(self.ref)


def run_on_node(function: Callable[[T], R], task: T) -> R:
    """Run a prepare task in a Ray worker: one Arrow thread, the task's one CPU (the parallelism
    is over tasks); a path this node cannot see is a user error naming the node."""
    set_worker_threads(1)
    try:
        return function(task)
    except FileNotFoundError as err:
        import ray

        node = ray.util.get_node_ip_address()
        raise DataError(
            f"not found on Ray node {node}: with executor=ray every node must see the corpus "
            "and the output at the same paths (a shared filesystem)",
            path=err.filename,
        ) from None


# --- tuning a process that prepares ---------------------------------------------------------------


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
