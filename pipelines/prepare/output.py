"""Where prepare writes: a local directory or any fsspec URL, and the state record that resumes it.

Files are written locally under a temporary name and renamed, then, for a remote output, uploaded
whole. ``prepare_state.json`` keeps pass 1's outcome and the sha256 of every finished file, so a
re-run redoes only what is missing or no longer matches. An output holding another dataset is
refused unless ``overwrite`` asks; one holding files prepare did not write is always refused.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ValidationError

from elmo_core.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, SplitStats
from elmo_core.errors import DataError
from elmo_core.location import (
    Location,
    atomic_write,
    is_temporary,
    remove_temporaries,
    sha256_file,
)
from pipelines.common.settings import elmo_home

STATE_NAME = "prepare_state.json"
WORK_NAME = ".prepare-work"
WORD_TYPES_NAME = "word_types.parquet"
SHARD_DIRS = ("train", "heldout")
# Everything prepare writes at the top of a dataset directory.
DATASET_ENTRIES = frozenset(
    {MANIFEST_NAME, STATE_NAME, WORK_NAME, WORD_TYPES_NAME, "vocab.txt", "vocab_counts.tsv"}
) | frozenset(SHARD_DIRS)


class CountSummary(BaseModel):
    """Pass-1 outcome: what the manifest needs from the counting, and which type order it made."""

    stats: dict[str, SplitStats]
    num_sentences: dict[str, int]
    num_tokens: dict[str, int]
    num_oov_tokens: dict[str, int]
    heldout_sentences: list[int]  # per input file, in input order
    vocab_size: int
    num_types: int
    imported_vocab: str | None
    checksums: dict[str, str]  # vocab.txt, vocab_counts.tsv
    type_order: str  # sha256 of the type order file: which word-type table the shards index


class PrepareState(BaseModel):
    """Which run (fingerprint), its counting result, and its finished files."""

    fingerprint: str
    count: CountSummary | None = None
    word_types: str | None = None  # sha256 of the finished word_types.parquet
    shards: dict[str, ShardInfo] = {}

    def restart_with(self, count: CountSummary) -> None:
        """A new counting result: what was built from another type order is void."""
        if self.count is None or self.count.type_order != count.type_order:
            self.shards = {}
            self.word_types = None
        self.count = count


class DatasetOutput:
    """A dataset directory being written: local staging, publishing, verification, state."""

    def __init__(self, url: str, fingerprint: str) -> None:
        self.url = url
        self.fingerprint = fingerprint
        self.published = Location(url)
        if self.published.local:
            self.local_root = Path(self.published.path)
        else:
            key = hashlib.sha256(url.encode()).hexdigest()[:16]
            self.local_root = elmo_home() / "cache" / "prepare" / key
        self.work = self.local_root / WORK_NAME / fingerprint[:16]

    def claim(self, overwrite: bool) -> None:
        """Make sure this run may write here, before anything is written.

        An empty or missing directory, or this same run's (same fingerprint: a resume), is taken
        as it is; another dataset is refused unless ``overwrite``, which removes it first; files
        prepare does not write are never touched, so such a directory is refused either way.
        """
        entries = {name for name in self.published.names() if not is_temporary(name)}
        foreign = sorted(entries - DATASET_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise DataError(
                f"the output holds files prepare did not write ({shown}); choose an empty or "
                "new --out",
                path=self.url,
            )
        recorded = self._recorded_state()
        if recorded is not None and recorded.fingerprint == self.fingerprint:
            return  # this run's own output: resumed or verified
        if not {MANIFEST_NAME, STATE_NAME} & entries:
            return  # the leftovers of a run that finished nothing
        if not overwrite:
            raise DataError(
                "the output holds another dataset (made from other inputs or settings); "
                "--overwrite replaces it, or choose another --out",
                path=self.url,
            )
        for name in entries:
            self.published.remove(name)

    def remove_unlisted_shards(self, manifest: Manifest) -> None:
        """Remove any shard the manifest does not list (an earlier run's), before it is written."""
        listed = {shard.path for split in manifest.splits.values() for shard in split.shards}
        for directory in SHARD_DIRS:
            for name in self.published.names(directory):
                if f"{directory}/{name}" not in listed and not is_temporary(name):
                    self.published.remove(f"{directory}/{name}")

    def load_state(self) -> PrepareState:
        """The previous run's record if it is the same run, with unverifiable shards dropped."""
        fresh = PrepareState(fingerprint=self.fingerprint)
        for stale in (self.local_root / WORK_NAME).glob("*"):
            if stale != self.work:
                shutil.rmtree(stale, ignore_errors=True)
        for directory in (self.local_root, self.local_root / "train", self.local_root / "heldout"):
            remove_temporaries(directory)  # of a run killed mid-write (a pool terminated)
        self.work.mkdir(parents=True, exist_ok=True)
        state = self._recorded_state()
        if state is None or state.fingerprint != self.fingerprint:
            return fresh
        state.shards = {
            name: info for name, info in state.shards.items() if self.verify(name, info.sha256)
        }
        if state.word_types is not None and not self.verify(WORD_TYPES_NAME, state.word_types):
            state.word_types = None
        return state

    def save_state(self, state: PrepareState) -> None:
        self.write_text(STATE_NAME, state.model_dump_json(indent=1))

    def record_shard(self, state: PrepareState, info: ShardInfo) -> None:
        """Publish a shard written under ``local_root`` and record it as finished."""
        self.publish(info.path)
        if not self.published.local:
            (self.local_root / info.path).unlink(missing_ok=True)
        state.shards[info.path] = info
        self.save_state(state)

    def record_word_types(self, state: PrepareState, digest: str) -> None:
        """Publish the word_types.parquet written under ``local_root`` and record it."""
        self.publish(WORD_TYPES_NAME)
        state.word_types = digest
        self.save_state(state)

    def write_text(self, relative: str, text: str) -> str:
        """Write a text file atomically and publish it; its sha256."""

        def write(path: Path) -> str:
            atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
            return hashlib.sha256(text.encode("utf-8")).hexdigest()

        return self.write_local(relative, write)

    def write_local(self, relative: str, write: Callable[[Path], str]) -> str:
        """Run ``write(local_path) -> sha256`` (which must be atomic), then publish."""
        path = self.local_root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = write(path)
        self.publish(relative)
        return digest

    def publish(self, relative: str) -> None:
        """Upload a file finished under ``local_root`` (which is the output itself when local)."""
        if not self.published.local:
            self.published.put_file(self.local_root / relative, relative)

    def has_all(self, checksums: dict[str, str]) -> bool:
        """True when each file is under ``local_root`` (fetched if remote) with its checksum."""
        for relative, digest in checksums.items():
            local = self.local_root / relative
            if not self.published.local and not local.exists() and self.verify(relative, digest):
                local.parent.mkdir(parents=True, exist_ok=True)
                self.published.get(relative, local)
            if not local.exists() or sha256_file(local) != digest:
                return False
        return True

    def verify(self, relative: str, digest: str) -> bool:
        """Does the published file exist with this sha256?"""
        return self.published.sha256(relative) == digest

    def finish(self) -> None:
        """Remove the work directory (and the staging copy of a remote output)."""
        shutil.rmtree(self.local_root / WORK_NAME, ignore_errors=True)
        if not self.published.local:
            shutil.rmtree(self.local_root, ignore_errors=True)

    def _recorded_state(self) -> PrepareState | None:
        """The published ``prepare_state.json``, if it is there and readable."""
        try:
            text = self.published.read_text(STATE_NAME)
            return None if text is None else PrepareState.model_validate_json(text)
        except (ValidationError, UnicodeDecodeError):
            return None
