"""The prepare step's cache: a key from its inputs and the version of the code that prepares.

The key hashes the ``elmo_core`` and ``pipelines.prepare`` files that decide a dataset's bytes
(:mod:`pipelines.common.code_version`). Whether the dataset still exists is checked at
call time rather than put in the key, which would hit stale records after a deletion.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

import elmo_core
import pipelines.prepare
from elmo_core.data.manifest import MANIFEST_NAME
from elmo_core.location import Location
from flows.params import DataParams
from pipelines.common.code_version import code_version, source_files
from pipelines.common.settings import elmo_home


def code_files() -> list[Path]:
    """The source files a prepared dataset depends on: ``elmo_core`` and the prepare stage."""
    return source_files(elmo_core, pipelines.prepare)


def prepare_cache_key(data: DataParams, version: str | None = None) -> str:
    """The key of preparing ``data``: corpus, resolved config, output and code version."""
    identity: dict[str, Any] = {
        "corpus": data.corpus,
        "config": data.prepare_config().dataset_params(),  # workers, executor: same bytes
        "out": data.dataset_dir(),
        "code": version or code_version(code_files()),
    }
    return "prepare-" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def dataset_exists(dataset: str) -> bool:
    """A dataset is complete once its manifest exists (prepare writes it last)."""
    return Location(dataset).exists(MANIFEST_NAME)


@dataclass
class PrepareCachePolicy(CachePolicy):
    """Prefect cache policy of the prepare task (its ``data: DataParams`` argument)."""

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        return prepare_cache_key(DataParams.model_validate(inputs["data"]))


def result_storage() -> Path:
    """Persisted task results (the prepare cache) live under ``ELMO_HOME``, read at run time."""
    return elmo_home() / "prefect" / "results"
