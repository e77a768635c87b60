"""What the train driver works out and checks in seconds, before Ray starts: the run's plan.

A bad dataset, storage or ``--init-from`` found inside the workers costs a cluster start and ends
in a Ray traceback; found here it is one line naming the path or key. Paths are made absolute here,
since workers run elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elmo_core.data.manifest import Manifest, load_manifest, manifest_sha256
from elmo_core.data.reader import load_word_types
from elmo_core.errors import ConfigError, DataError
from elmo_core.location import Location, absolute_location, join_url
from pipelines.common.handoff import TrainResult
from pipelines.serving.bilm_loader import BiLMReference, initial_bilm, resolve_bilm
from pipelines.train.job_config import TrainJobConfig, run_name, storage_root
from pipelines.train.run_directory import FINISHED_FILE, RunDirectory


@dataclass(frozen=True)
class TrainPlan:
    """A training run the driver has checked: what it reads, starts from, and where it lives."""

    data: str  # absolute path or URL of the prepared dataset
    manifest: Manifest
    dataset_sha256: str
    init_from: BiLMReference | None  # pinned (an alias to its version)
    name: str
    run_dir: RunDirectory
    validation_windows: int

    def finished(self) -> TrainResult | None:
        """The run's result when it has finished (``FINISHED.json``), else None."""
        record = self.run_dir.read_json(FINISHED_FILE)
        return None if record is None else TrainResult.model_validate(record)


def plan_training(
    cfg: TrainJobConfig, data: str, init_from: str | None = None, init_options: str | None = None
) -> TrainPlan:
    """Check everything a user gave the train stage; raise the first mistake as an ElmoError."""
    data = absolute_location(data)
    dataset_sha256 = manifest_sha256(data)
    manifest = load_manifest(data)
    _check_dataset(data, manifest, cfg.run.num_workers)
    if cfg.model.num_samples >= manifest.vocab.size:
        raise ConfigError(
            f"{cfg.model.num_samples} sampled candidates, but the dataset's vocabulary has only "
            f"{manifest.vocab.size} words: use fewer, or a bigger corpus",
            key="model.num_samples",
        )
    source = None
    if init_from is not None:
        source = resolve_bilm(init_from, init_options, options_key="init_options")
        initial_bilm(cfg.model, manifest.vocab.size, source)  # WeightsError if they do not fit
    name = run_name(cfg, dataset_sha256, None if source is None else source.location)
    run_dir = RunDirectory(f"{storage_root(cfg.run)}/{name}")
    _check_writable(run_dir)
    windows = validation_windows(manifest, cfg)
    return TrainPlan(data, manifest, dataset_sha256, source, name, run_dir, windows)


def validation_windows(manifest: Manifest, cfg: TrainJobConfig) -> int:
    """Windows of B × T that hold about ``validation_sentences`` heldout sentences.

    A sentence of n tokens fills n + 1 positions (bilm-tf's stream batching).
    """
    heldout = manifest.split("heldout")
    if heldout.num_sentences == 0:
        raise ConfigError(
            "the dataset's heldout split is empty: nothing to validate on",
            key="train.validation_sentences",
        )
    per_sentence = (heldout.num_tokens + heldout.num_sentences) / heldout.num_sentences
    sentences = min(cfg.train.validation_sentences, heldout.num_sentences)
    per_window = cfg.train.batch_size * cfg.train.unroll_steps
    return max(1, math.ceil(sentences * per_sentence / per_window))


def _check_dataset(data: str, manifest: Manifest, num_workers: int) -> None:
    """The word types load, every shard the manifest lists exists, and every rank gets data."""
    load_word_types(data, manifest)
    dataset = Location(data)
    for split in ("train", "heldout"):
        for shard in manifest.split(split).shards:
            if not dataset.exists(shard.path):
                raise DataError(
                    "shard listed in the manifest is missing: re-run prepare with the same "
                    "options, which repairs the dataset",
                    path=join_url(data, shard.path),
                )
    sentences = manifest.split("train").num_sentences
    if sentences < num_workers:
        raise DataError(
            f"the train split has {sentences} sentence(s), fewer than the {num_workers} workers: "
            "use fewer workers (run.num_workers) or a bigger corpus",
            path=data,
        )


def _check_writable(run_dir: RunDirectory) -> None:
    try:
        run_dir.makedirs()
    except OSError as err:
        raise ConfigError(
            f"cannot create the run directory {run_dir.url}: {err}", key="run.storage_path"
        ) from None
