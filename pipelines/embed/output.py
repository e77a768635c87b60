"""Where ``elmo embed`` writes: a directory or fsspec URL of whole files, and what they hold.

Every file appears whole or not at all — a local one is written under a temporary name and
renamed (:func:`~elmo_core.files.atomic_write`), a remote one is written locally and sent as one
object, which an object store shows only once complete — so a shard that exists is finished and
a re-run skips it. ``embed.json`` records what the shards are vectors of (the pinned biLM, the
tokenizer, the input files' checksums, the output, dtype, format and chunk size): a re-run with
other settings is refused instead of mixing two kinds of vectors in one directory.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from elmo_core.errors import ConfigError
from elmo_core.files import atomic_write, is_temporary
from pipelines.common.locations import is_remote_url

SETTINGS_FILE = "embed.json"


class EmbeddingsDir:
    """The output directory ``url`` (a local path or any fsspec URL)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.remote = is_remote_url(self.url)
        # Actors write shards here while the driver looks: a cached listing (fsspec's default
        # for object stores) would hide what they wrote since.
        self.fs, self.path = fsspec.core.url_to_fs(self.url, use_listings_cache=False)

    def location(self, name: str) -> str:
        return f"{self.url}/{name}"

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(f"{self.path}/{name}"))

    def names(self) -> list[str]:
        """The files in the directory, by name; none when it does not exist."""
        if not self.fs.isdir(self.path):
            return []
        return sorted(Path(entry).name for entry in self.fs.ls(self.path, detail=False))

    def write(self, name: str, write: Callable[[Path], object]) -> None:
        """``write(local file)``, then the file appears as ``name``, whole."""
        if not self.remote:
            atomic_write(Path(self.path) / name, write)
            return
        with tempfile.TemporaryDirectory(prefix="elmo-embed-") as scratch:
            local = Path(scratch) / name
            write(local)
            self.fs.put_file(str(local), f"{self.path}/{name}")

    def write_table(self, name: str, table: pa.Table) -> None:
        self.write(name, lambda path: pq.write_table(table, path))

    def read_table(self, name: str) -> pa.Table:
        with self.fs.open(f"{self.path}/{name}", "rb") as handle:
            return pq.read_table(handle)

    def remove(self, name: str) -> None:
        self.fs.rm(f"{self.path}/{name}")

    def claim(self, settings: dict[str, Any]) -> None:
        """Make this the output of ``settings``: record them in a new or empty directory,
        accept a directory that records the same ones, refuse anything else."""
        settings = json.loads(json.dumps(settings))  # compared as they read back
        recorded = self._recorded()
        if recorded is None:
            foreign = [name for name in self.names() if not is_temporary(name)]
            if foreign:
                raise ConfigError(
                    f"{self.url} holds files that elmo embed did not write "
                    f"({', '.join(foreign[:3])}): choose a new or empty directory",
                    key="out",
                )
            text = json.dumps(settings, indent=2, sort_keys=True)
            self.fs.makedirs(self.path, exist_ok=True)
            self.write(SETTINGS_FILE, lambda path: path.write_text(text, encoding="utf-8"))
            return
        differing = sorted(
            key
            for key in settings.keys() | recorded.keys()
            if settings.get(key) != recorded.get(key)
        )
        if differing:
            raise ConfigError(
                f"{self.url} holds vectors made with other settings (its {SETTINGS_FILE} differs "
                f"in {', '.join(differing)}): use another --out, or delete it to start over",
                key="out",
            )

    def _recorded(self) -> dict[str, Any] | None:
        if not self.exists(SETTINGS_FILE):
            return None
        with self.fs.open(f"{self.path}/{SETTINGS_FILE}", "rt", encoding="utf-8") as handle:
            recorded: dict[str, Any] = json.load(handle)
        return recorded
