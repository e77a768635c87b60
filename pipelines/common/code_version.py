"""The version of the code behind a stored result, for the keys that decide when it is reused.

A cached dataset or a reused adapt or analyze run is only as current as the code that made it, and
Prefect's ``TASK_SOURCE`` sees only a task's own lines, so such keys hash the source files that
decide the result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import elmo_core
from elmo_core.location import sha256_file

ROOT = Path(elmo_core.__file__).parent.parent  # the directory holding the packages


def source_files(*packages: ModuleType) -> list[Path]:
    """Every ``.py`` file under each package's directory, subpackages included, in a stable
    order."""
    roots = [Path(str(package.__file__)).parent for package in packages]
    return sorted({path for root in roots for path in root.rglob("*.py")})


def code_version(files: Sequence[Path], root: Path = ROOT) -> str:
    """sha256 over the names (relative to ``root``) and sha256s of ``files``."""
    listing = [f"{path.relative_to(root)}\0{sha256_file(path)}\0" for path in files]
    return hashlib.sha256("".join(listing).encode()).hexdigest()
