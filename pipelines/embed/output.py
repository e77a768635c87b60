"""Where ``elmo embed`` writes: a directory or fsspec URL of whole files, and what they hold.

A shard that exists is finished. ``embed.json`` records what the shards are vectors of, so a re-run
with other settings is refused instead of mixing two kinds of vectors in one directory.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.parquet as pq

from elmo_core.errors import ConfigError
from elmo_core.location import Location, is_temporary

SETTINGS_FILE = "embed.json"

Format = Literal["parquet", "hdf5"]  # shards, or one HDF5 file as AllenNLP's elmo command wrote
FORMATS: tuple[Format, ...] = get_args(Format)


class EmbeddingsDir(Location):
    """The output directory ``url`` (a local path or any fsspec URL)."""

    def write_table(self, name: str, table: pa.Table) -> None:
        self.write(name, lambda path: pq.write_table(table, path))

    def read_table(self, name: str) -> pa.Table:
        with self.open(name) as handle:
            return pq.read_table(handle)

    def claim(self, settings: dict[str, Any]) -> None:
        """Make this the output of ``settings``: record them in a new or empty directory,
        accept a directory that records the same ones, refuse anything else."""
        settings = json.loads(json.dumps(settings))  # compared as they read back
        recorded = self.read_json(SETTINGS_FILE)
        if recorded is None:
            foreign = [name for name in self.names() if not is_temporary(name)]
            if foreign:
                raise ConfigError(
                    f"{self.url} holds files that elmo embed did not write "
                    f"({', '.join(foreign[:3])}): choose a new or empty directory",
                    key="out",
                )
            self.write_text(SETTINGS_FILE, json.dumps(settings, indent=2, sort_keys=True))
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
