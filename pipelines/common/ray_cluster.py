"""The one way the platform connects to Ray: join ``RAY_ADDRESS``, or start a local Ray.

A local Ray keeps its object store small, since the stages stream data from shards and pass only
control messages through it; it starts quietly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from elmo_core.errors import ElmoError
from pipelines.common.console import quiet_environment
from pipelines.common.settings import elmo_home

log = logging.getLogger(__name__)

MIN_OBJECT_STORE_BYTES = 200 * 1024**2
MAX_OBJECT_STORE_BYTES = 4 * 1024**3
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
# Ray Train's loggers whose warnings a local Ray's workers keep to themselves (setup_local_worker)
PLACEMENT_GROUP_CLEANER_LOGGER = (
    "ray.train.v2._internal.execution.controller.placement_group_cleaner"
)
AUTOSCALING_REQUEST_LOGGER = (
    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"
)
QUIETED_TRAIN_LOGGERS = (PLACEMENT_GROUP_CLEANER_LOGGER, AUTOSCALING_REQUEST_LOGGER)


def connect_ray(num_cpus: int | None = None) -> None:
    """Make sure this process is connected to Ray; idempotent.

    ``RAY_ADDRESS`` (``auto``, ``ray://...`` or ``host:port``) joins that cluster; otherwise a local
    Ray starts with ``num_cpus`` (default: all cores) and its temporary files under ``ELMO_HOME``.
    The local start is explicit (``address="local"``): a bare ``ray.init`` would join any Ray
    already running on the machine (a ``ray start`` head left by someone) and then refuse
    ``num_cpus``. Ray's INFO lines in this process ("Started a local Ray instance") are not
    logged, and its workers start with :func:`setup_local_worker`.
    """
    quiet_environment()  # before Ray Train reads it, and before a local Ray's workers start
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        log.info("joining Ray cluster at %s", address)
        ray.init(address=address, log_to_driver=True)
        return
    cpus = num_cpus or os.cpu_count() or 1
    log.info("starting a local Ray with %d CPUs", cpus)
    # Ray turns token authentication on for a local cluster, its default, and warns that it
    # did on every start: that logger is raised to ERROR for the start of our own loopback Ray.
    logging.getLogger(TOKEN_AUTH_LOGGER).setLevel(logging.ERROR)
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        object_store_memory=_local_object_store_bytes(),
        logging_level=logging.WARNING,
        runtime_env={"worker_process_setup_hook": setup_local_worker},
        _temp_dir=str(_short_temp_dir()),
    )


def cpus_available() -> float | None:
    """The CPUs of the Ray this process uses or will start: None for a cluster it has not joined
    yet (``RAY_ADDRESS``; it may grow)."""
    if ray.is_initialized():
        return float(ray.cluster_resources().get("CPU", 0))
    if os.environ.get("RAY_ADDRESS"):
        return None
    return float(os.cpu_count() or 1)


def setup_local_worker() -> None:
    """Run by every worker process of a local Ray as it starts (its ``worker_process_setup_hook``).

    Ray Train's PlacementGroupCleaner asks the state API every second whether the training
    controller still lives. Its client looks for "the" Ray on the machine (``RAY_ADDRESS``, else
    the running GCS processes) and, where two run (another's, a test session's), dies with a
    traceback: ``RAY_ADDRESS`` names this one. Its question then reaches a Ray without the
    dashboard, which does not serve the state API (Ray's TODO in
    ``ray._private.services.start_api_server``), and each failure is a warning: that logger
    passes only errors. The controller stops the cleaner when training ends.

    The controller also asks Ray Data's autoscaling coordinator, an actor it starts, for the
    workers' resources, and waits 5 s for the answer. On a loaded core the actor's start takes
    longer, and Ray logs a warning with a traceback of its own saying that it is safe to ignore;
    a local Ray has no autoscaler to ask, so that logger passes only errors too. A filter, not a
    level: the controller's logging setup (``logging.config.dictConfig`` on ``ray.train``)
    resets the levels of the loggers under it, and keeps their filters.
    """
    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    quiet_train_loggers()


def quiet_train_loggers() -> None:
    """Only errors from :data:`QUIETED_TRAIN_LOGGERS` in this process (idempotent)."""
    for name in QUIETED_TRAIN_LOGGERS:
        logger = logging.getLogger(name)
        if _errors_only not in logger.filters:
            logger.addFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def ray_get(refs: Any) -> Any:
    """``ray.get``, with a user error (:class:`~elmo_core.errors.ElmoError`) raised inside a
    task re-raised here as itself: it names the file, line or key, not a Ray traceback."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, ElmoError):
            raise err.cause from None
        raise


def _local_object_store_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(total // 20, MIN_OBJECT_STORE_BYTES), MAX_OBJECT_STORE_BYTES))


def _short_temp_dir() -> object:
    """Ray's socket paths must stay under 107 bytes, so a deep ``ELMO_HOME`` falls back to /tmp."""
    preferred = elmo_home() / "ray"
    if len(str(preferred)) > 40:
        return f"/tmp/ray-elmo-{os.getuid()}"
    return preferred
