"""What a run read, as MLflow datasets: the prepared corpus with its profile (sentences, tokens,
OOV rate and shards per split, the vocabulary) and its rows' schema; a task's files by checksum.

A dataset's digest is its content's sha256, so two runs on the same data show the same digest.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import mlflow
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types import ColSpec, DataType, Schema
from mlflow.types.schema import Array

from elmo_core.data.manifest import Manifest, load_manifest, manifest_sha256

DIGEST_CHARS = 36  # the longest digest MLflow's stores keep
# A shard's rows: a sentence as word type ids (elmo_core.data.shards.TRAIN_SCHEMA)
SENTENCE_SCHEMA = Schema([ColSpec(Array(DataType.integer), "types")])


class ProfiledDataset(MetaDataset):
    """A dataset that is only described (no rows loaded), with a profile MLflow shows: its
    ``MetaDataset`` records a schema but no profile."""

    def __init__(self, *args: Any, profile: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._profile = dict(profile)

    @property
    def profile(self) -> Mapping[str, Any]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return super().to_dict() | ({"profile": json.dumps(self._profile)} if self._profile else {})


def dataset_profile(manifest: Manifest) -> dict[str, Any]:
    """Per split its sentences, tokens, OOV rate and shards; the vocabulary and word types."""
    profile: dict[str, Any] = {
        f"{name}_{key}": value
        for name, split in manifest.splits.items()
        for key, value in (
            ("sentences", split.num_sentences),
            ("tokens", split.num_tokens),
            ("oov_rate", round(split.oov_rate, 6)),
            ("shards", len(split.shards)),
        )
    }
    words = {"vocabulary": manifest.vocab.size, "word_types": manifest.word_types.num_types}
    return profile | words


def log_dataset(dataset_url: str, context: str) -> None:
    """Record the prepared dataset as the active run's input (MLflow's Datasets panel): named
    by its directory, its digest the manifest's sha256 (which names every shard by checksum),
    its source the URL it was read from, with its profile and its rows' schema; ``context``
    says how the run used it (``training``, ``evaluation``)."""
    name = dataset_url.rstrip("/").rsplit("/", 1)[-1]
    profile = dataset_profile(load_manifest(dataset_url))
    digest = manifest_sha256(dataset_url)
    log_input_file(dataset_url, name, digest, context, schema=SENTENCE_SCHEMA, profile=profile)


def log_input_file(
    location: str,
    name: str,
    sha256: str,
    context: str,
    *,
    schema: Schema | None = None,
    profile: Mapping[str, Any] | None = None,
) -> None:
    """Record data at ``location`` (a path or URL) as the active run's input, its digest the
    content's ``sha256`` (cut to what MLflow keeps)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the same
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(location)
    digest = sha256[:DIGEST_CHARS]
    dataset = ProfiledDataset(
        source, name=name, digest=digest, schema=schema, profile=profile or {}
    )
    mlflow.log_input(dataset, context=context)
