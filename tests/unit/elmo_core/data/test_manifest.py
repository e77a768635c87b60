"""manifest: the sha256 that identifies a dataset's content."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from elmo_core.data.manifest import manifest_sha256
from elmo_core.errors import DataError


def test_manifest_hash_is_the_sha256_of_manifest_json(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_bytes(b'{"x": 1}\n')
    assert manifest_sha256(str(tmp_path)) == hashlib.sha256(b'{"x": 1}\n').hexdigest()
    with pytest.raises(DataError, match="manifest.json"):
        manifest_sha256(str(tmp_path / "absent"))
