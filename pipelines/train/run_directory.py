"""A training run's directory, ``storage_path/name``, local or any fsspec URL (s3://).

It holds ``mlflow_run_id.json``, ``checkpoints/``, ``best/``, ``model/`` and ``FINISHED.json``.

Everything in it is written whole or not at all, so a run killed at any instant leaves files a
resumed run can trust: a local file or directory is staged beside its target and renamed into
place, and an object store's PUT of one object is atomic. A directory on an object store is many
objects, which is why :mod:`pipelines.train.checkpoint_store` commits a checkpoint with a marker
written after all of its parts.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec

from elmo_core.files import atomic_write, follow_umask, make_staging_dir
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import save_bilm

BEST_DIR = "best"  # the model with the best validation perplexity so far
MODEL_DIR = "model"  # the final model, copied from the last checkpoint
FINISHED_FILE = "FINISHED.json"  # the TrainResult of a finished run
RUN_ID_FILE = "mlflow_run_id.json"  # the run's MLflow run


class RunDirectory:
    """``storage_path/name``: small JSON records, files and whole model directories."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # Ranks and the driver write here at once: a cached listing (fsspec's default for object
        # stores) would show the driver checkpoints that rank 0 has since pruned.
        self.fs, self.path = fsspec.core.url_to_fs(self.url, use_listings_cache=False)
        self.local = "file" in self.fs.protocol

    def join(self, name: str) -> str:
        return f"{self.url}/{name}"

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(f"{self.path}/{name}"))

    def read_json(self, name: str) -> dict[str, Any] | None:
        path = f"{self.path}/{name}"
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "rt", encoding="utf-8") as handle:
            loaded: dict[str, Any] = json.load(handle)
        return loaded

    def write_json(self, name: str, record: dict[str, Any]) -> None:
        self.write_text(name, json.dumps(record, indent=2))

    def write_text(self, name: str, text: str) -> None:
        """Whole or not at all: a local file is renamed into place, an object PUT is atomic."""
        target = f"{self.path}/{name}"
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        if self.local:
            atomic_write(Path(target), lambda path: path.write_text(text, encoding="utf-8"))
        else:
            self.fs.pipe(target, text.encode())

    def subdirectories(self, name: str) -> list[str]:
        """Names of the directories directly under ``name`` (none if it does not exist)."""
        path = f"{self.path}/{name}"
        if not self.fs.exists(path):
            return []
        entries = self.fs.ls(path, detail=True)
        return sorted(
            entry["name"].rstrip("/").rsplit("/", 1)[-1]
            for entry in entries
            if entry["type"] == "directory"
        )

    def remove(self, name: str) -> None:
        path = f"{self.path}/{name}"
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def put_model(self, bilm: BiLM, name: str) -> str:
        """Save ``bilm`` as ``name/`` in the run directory, replacing the previous one."""
        with tempfile.TemporaryDirectory() as staging:
            save_bilm(bilm, staging)
            self.put_directory(Path(staging), name)
        return self.join(name)

    def put_directory(self, local: Path, name: str) -> None:
        """Copy ``local`` to ``name/``, replacing it: locally renamed into place whole."""
        target = f"{self.path}/{name}"
        if not self.local:
            self.remove(name)
            self.fs.put(str(local), target, recursive=True)
            return
        parent = Path(target).parent
        parent.mkdir(parents=True, exist_ok=True)
        incoming = make_staging_dir(parent, prefix=f".{Path(target).name}.")
        shutil.copytree(local, incoming, dirs_exist_ok=True)
        follow_umask(incoming)  # copytree kept the staging directory's 0700
        if Path(target).exists():
            shutil.rmtree(target)
        incoming.rename(target)

    def put_file(self, local: Path, name: str) -> None:
        """Copy one file to ``name``, whole or not at all."""
        target = f"{self.path}/{name}"
        if not self.local:
            self.fs.put_file(str(local), target)
            return
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(Path(target), lambda path: shutil.copyfile(local, path))

    def get(self, name: str, local: Path) -> Path:
        """``name`` (a file or directory) as a local path: itself when local, else a copy."""
        if self.local:
            return Path(self.path) / name
        self.fs.get(f"{self.path}/{name}", str(local), recursive=True)
        return local

    def copy(self, source: str, name: str) -> None:
        """Copy the directory ``source`` of this run directory to ``name``, replacing it."""
        if self.local:
            self.put_directory(Path(self.path) / source, name)
            return
        self.remove(name)
        self.fs.copy(f"{self.path}/{source}", f"{self.path}/{name}", recursive=True)
