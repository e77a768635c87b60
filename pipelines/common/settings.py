"""Where the platform keeps its local state (``ELMO_HOME``), and which servers it talks to.

Each server switches from the embedded default to a real one by its usual environment variable.
"""

from __future__ import annotations

import os
from pathlib import Path

RAY_JOBS_ENV = "RAY_API_SERVER_ADDRESS"  # the Ray jobs API (dashboard) that training is sent to


def elmo_home() -> Path:
    """The absolute project state directory, created on first use."""
    home = Path(os.environ.get("ELMO_HOME", Path.home() / ".elmo")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite file at an absolute path under ``ELMO_HOME``.

    The path is absolute so every process (Ray workers, Prefect tasks) reaches the same store.
    """
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    return f"sqlite:///{elmo_home() / 'mlflow.db'}"
