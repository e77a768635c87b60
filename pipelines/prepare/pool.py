"""The pool prepare's tasks run in: local worker processes, or Ray tasks (``executor: ray``).

Tasks are picklable and pass paths, not data (:mod:`pipelines.prepare.count`,
:mod:`pipelines.prepare.encode`, :mod:`pipelines.prepare.shuffle`); each worker process is tuned
as :mod:`pipelines.prepare.tuning` says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from pipelines.prepare.tuning import cores_per_worker, set_worker_threads, tune_process

T = TypeVar("T")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class WorkerPool:
    """``workers`` spawned processes (created on first use), each with its share of the cores
    for Arrow's threads (:func:`~pipelines.prepare.tuning.cores_per_worker`); or, when
    ``workers == 1``, this process, running as many tasks at once as it has cores, on threads:
    the tasks' time is in Arrow and NumPy kernels, which release the GIL. A worker holds a
    block of text per task it runs, so one worker on two cores peaks at about the memory of two
    worker processes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Any = None
        self._saved = (pa.cpu_count(), pa.io_thread_count())

    def __enter__(self) -> WorkerPool:
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
    """Where prepare's tasks run: :class:`WorkerPool`, or Ray's
    :class:`~pipelines.prepare.ray_pool.RayTaskPool`."""

    def imap(self, function: Callable[[T], R], tasks: Sequence[T]) -> Iterator[R]: ...

    def submit(self, function: Callable[[T], R], task: T) -> Pending[R]: ...


def task_pool(executor: str, workers: int) -> AbstractContextManager[TaskPool]:
    """The pool of ``executor`` (``processes`` or ``ray``) with ``workers`` tasks at once."""
    if executor == "ray":
        from pipelines.prepare.ray_pool import RayTaskPool

        return RayTaskPool(workers)
    return WorkerPool(workers)


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
    context.set_forkserver_preload(["pipelines.prepare.count", "pipelines.prepare.encode"])
    return context
