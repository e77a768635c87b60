"""The prepare step's cache: a key from its inputs and the version of the code that prepares.

Prefect's ``TASK_SOURCE`` sees only the task's own lines, so the key hashes the ``elmo_core`` and
``pipelines`` files that decide a dataset's bytes. Whether the dataset still exists is checked at
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
from elmo_core.location import Location, sha256_file
from flows.params import DataParams


def code_files() -> list[Path]:
    """The source files a prepared dataset depends on, in a stable order."""
    core = Path(elmo_core.__file__).parent
    stage = Path(pipelines.prepare.__file__).parent  # the prepare stage's package, whole
    files = set(core.rglob("*.py"))
    files.update(stage.glob("*.py"))
    return sorted(files)


def code_version(files: list[Path] | None = None, root: Path | None = None) -> str:
    """sha256 over the names (relative to ``root``) and sha256s of ``files`` (default: the
    prepare code, relative to the directory holding the packages)."""
    base = root or Path(elmo_core.__file__).parent.parent
    listing = [
        f"{path.relative_to(base)}\0{sha256_file(path)}\0"
        for path in (code_files() if files is None else files)
    ]
    return hashlib.sha256("".join(listing).encode()).hexdigest()


def prepare_cache_key(data: DataParams, version: str | None = None) -> str:
    """The key of preparing ``data``: corpus, resolved config, output and code version."""
    identity: dict[str, Any] = {
        "corpus": data.corpus,
        "config": data.prepare_config().dataset_params(),  # workers, executor: same bytes
        "out": data.dataset_dir(),
        "code": version or code_version(),
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
