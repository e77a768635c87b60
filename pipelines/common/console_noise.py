"""The libraries' console noise, turned off where it starts, through each library's own setting.

Nothing is filtered as text: each source of chatter (Ray Train's doubled prints and INFO records,
Ray's worker prefixes and INFO loggers, MLflow's progress bars) is switched off by the environment
variable its library reads, with the reason beside it in :data:`QUIET_ENVIRONMENT`. A local Ray's
workers start from the driver's environment, so :func:`quiet_environment` runs before
``ray.init`` and, where it can, before ``import mlflow`` (``python -m flows.run_local``).
"""

from __future__ import annotations

import os

QUIET_ENVIRONMENT = {
    # Ray Train logs a worker's print and prints it too (Ray wraps sys.stdout): every line twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # Its watcher logs a core_worker error as it starts; train restarts failed workers itself.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Our workers' lines say what they are ("[train] step …"); Ray's name/pid prefix adds colour.
    "RAY_DISABLE_WORKER_LOG_PREFIX": "1",
    # Else a worker's root logger is at INFO (each report's record, matplotlib's font cache);
    # Python's default then prints warnings and errors only (no JSON logs for the Train view).
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    # Ray's own INFO lines ("Setting up process group"), read as a local Ray's processes start.
    "RAY_LOGGER_LEVEL": "warning",
    # A progress bar per artifact download and INFO on routine steps; read at `import mlflow`.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def quiet_environment() -> None:
    """Set each of :data:`QUIET_ENVIRONMENT` in this process, unless the user already set it."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
