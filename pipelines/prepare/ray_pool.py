"""Prepare's tasks on a Ray cluster (``executor: ray``) instead of a pool of local processes.

The tasks are the same as the local pool's (:mod:`pipelines.prepare.pool`): one per input file
and one per training shard, run as Ray tasks on the cluster :func:`~pipelines.common.ray_cluster.
connect_ray` joins (``RAY_ADDRESS``) or starts. They pass paths, not data, so every node must
see the corpus and the output at the same paths: a shared filesystem (NFS, Lustre, a mounted
bucket), as a multi-node cluster preparing the 1B Word Benchmark has, or a single-node Ray. A
remote output (``s3://...``) is staged under ``ELMO_HOME`` before it is uploaded, so on several
nodes ``ELMO_HOME`` must be shared too. A node that does not see a path is named in the error.
Only results travel through the object store: each file's type counts (a few MB) and the
records of written shards.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from elmo_core.errors import DataError
from pipelines.prepare.tuning import set_worker_threads

T = TypeVar("T")
R = TypeVar("R")


class RayTaskPool:
    """Prepare's task pool on Ray: at most ``workers`` tasks at once, or one per CPU of the
    cluster when ``workers`` is 1."""

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
