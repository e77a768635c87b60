"""What a local Ray's workers keep to themselves: Ray Train's warnings that a loaded core or a
Ray without a dashboard sets off, even after the controller sets up its logging."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Iterator

import pytest

from pipelines.common.ray_cluster import (
    AUTOSCALING_REQUEST_LOGGER,
    QUIETED_TRAIN_LOGGERS,
    quiet_train_loggers,
)


@pytest.fixture
def quieted() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in QUIETED_TRAIN_LOGGERS]
    before = [list(logger.filters) for logger in loggers]
    quiet_train_loggers()
    quiet_train_loggers()  # as a second start of the hook would
    yield
    for logger, filters in zip(loggers, before, strict=True):
        logger.filters = filters


def test_only_errors_pass_even_after_the_controller_configures_ray_train_logging(
    quieted: None, caplog: pytest.LogCaptureFixture
) -> None:
    # what Ray Train's controller does as it starts: its dictConfig resets the levels below it
    logging.config.dictConfig(
        {"version": 1, "disable_existing_loggers": False, "loggers": {"ray.train": {}}}
    )
    logger = logging.getLogger(AUTOSCALING_REQUEST_LOGGER)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.INFO):
        logger.warning("Failed to send resource request for train-1")
        logger.error("the coordinator is gone")
    assert [record.getMessage() for record in caplog.records] == ["the coordinator is gone"]
