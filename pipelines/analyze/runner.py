"""An analysis's task runs side by side: one Ray task each, one CPU (or a share of a GPU) each.

The runs are small heads over cached activations, so one thread each and one run per core beats
one run with every thread (``benchmarks/results/analyze_twin-2026-11-28.md``). The task's splits
go into the object store once; every run reads them there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import ray
import torch

from elmo_core.analysis.task_runs import PlannedRun, Runner, RunOutcome, train_run
from elmo_core.tasks.trainer import TaskSplit
from pipelines.common.ray_cluster import connect_ray, ray_get

RUNS_PER_GPU = 4  # a head over cached activations uses a small part of a GPU


def ray_runner(splits: Mapping[str, TaskSplit]) -> Runner:
    """A runner that trains each run as a Ray task (on a GPU where the cluster has one)."""
    connect_ray()
    gpus = 1 / RUNS_PER_GPU if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    remote = ray.remote(_train_on_worker).options(num_cpus=1, num_gpus=gpus)
    stored = ray.put(dict(splits))

    def run_all(runs: Sequence[PlannedRun]) -> Iterator[tuple[int, RunOutcome]]:
        pending = {remote.remote(stored, run): index for index, run in enumerate(runs)}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    yield pending.pop(ref), ray_get(ref)
        finally:  # stopped early (an error, Ctrl-C): the runs not yet finished are not wanted
            for ref in pending:
                ray.cancel(ref)

    return run_all


def _train_on_worker(splits: dict[str, TaskSplit], run: PlannedRun) -> RunOutcome:
    """One run in a Ray worker, with as many torch threads as the CPUs the task was given."""
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    torch.set_num_threads(max(1, int(cpus)))
    device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
    return train_run(run, splits, device)
