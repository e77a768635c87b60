"""One real local Ray instance shared by every integration test that needs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """``ray.init`` once per session (2 CPUs, no dashboard, a small object store)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2)
    yield
    ray.shutdown()
