"""The libraries' console noise, turned off where it starts, through each library's own setting.

A run of the pipeline printed about 90 lines, most of them chatter nobody acts on. None of it is
filtered as text; each source is switched off:

- Ray Train patches ``print`` in its workers to log the line, and also prints it itself whenever
  ``sys.stdout`` is wrapped, which Ray always does in a worker: every line reached the driver twice.
  ``RAY_TRAIN_ENABLE_PRINT_PATCH=0`` leaves ``print`` alone (Ray passes it on to the workers).
- Ray Train's preemption watcher logs a core_worker error as it starts (its constructor arguments
  sit in the object store). The train stage restarts a failed worker group itself (Ray's
  ``max_failures`` and ``max_preemption_failures`` are 0), so the watcher changes nothing here:
  ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0``.
- Ray prefixes every line a worker prints with its name and pid, in colour codes even when the
  output is not a terminal; our workers' lines say what they are (``[train] step …``):
  ``RAY_DISABLE_WORKER_LOG_PREFIX=1``.
- Ray Train sets a worker's root logger to INFO, so its record of every ``report`` reached the
  console (``Reporting training result 1: TrainingReport(…)``, whose loss is the last step's, not
  the mean the ``[train]`` line prints), and so did matplotlib's ``generated new fontManager``.
  ``RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING=0`` leaves a worker's logging as Python's: warnings
  and errors print, INFO does not (Ray Train's JSON log files for the dashboard's Train view are not
  written). Ray's own loggers then print their INFO lines (``Setting up process group``):
  ``RAY_LOGGER_LEVEL=warning``, which a local Ray's processes read as they start.
- MLflow draws a progress bar for every artifact download and logs its routine steps (creating
  tables, starting system metrics) at INFO: ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false`` and
  ``MLFLOW_LOGGING_LEVEL=WARNING`` (read when mlflow is imported).

A local Ray's workers start from the driver's environment, so :func:`quiet_environment` runs
before ``ray.init``, and before ``import mlflow`` where it can (``python -m flows.run_local``).
What a local Ray's workers need besides is set as they start
(:func:`pipelines.common.ray_cluster.setup_local_worker`).
"""

from __future__ import annotations

import os

QUIET_ENVIRONMENT = {
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_DISABLE_WORKER_LOG_PREFIX": "1",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "RAY_LOGGER_LEVEL": "warning",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def quiet_environment() -> None:
    """Set each of :data:`QUIET_ENVIRONMENT` in this process, unless the user already set it."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
