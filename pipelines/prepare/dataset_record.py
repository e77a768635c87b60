"""The prepare stage's MLflow run: what was prepared from what, its sizes, and where time went.

A flow's prepare is a child of the flow's run like every other stage; ``elmo prepare`` on its
own is a top-level run. The dataset it wrote is the run's input in MLflow's Datasets panel (the
same digest as the train, evaluate and adapt runs that read it), its manifest an artifact.
"""

from __future__ import annotations

import mlflow

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import MANIFEST_NAME, Manifest
from pipelines.tracking.stage_runs import log_config, log_dataset


def log_prepared(
    cfg: PrepareConfig,
    corpus: str,
    dataset: str,
    manifest: Manifest,
    seconds: dict[str, float],
    num_shards: tuple[int, int],
) -> None:
    """Log into the active run: the config, the corpus, per-split sizes, the vocabulary, the
    phases' seconds and the shards (written, reused) of a finished prepare. A split's
    ``_tokens`` are its words, as the tokenizer split them (the evaluate run's
    ``_predicted_tokens`` add one end per sentence)."""
    log_config(cfg, "prepare_config.json")
    mlflow.log_params({"corpus": corpus, "dataset": dataset})
    metrics = {
        "vocabulary_size": float(manifest.vocab.size),
        "word_types": float(manifest.word_types.num_types),
        "shards_written": float(num_shards[0]),
        "shards_reused": float(num_shards[1]),
        **{f"seconds_{phase}": value for phase, value in seconds.items()},
    }
    for name, split in manifest.splits.items():
        metrics |= {
            f"{name}_sentences": float(split.num_sentences),
            f"{name}_tokens": float(split.num_tokens),
            f"{name}_oov_rate": split.oov_rate,
            f"{name}_invalid_utf8_replacements": float(split.stats.invalid_utf8_replacements),
        }
    mlflow.log_metrics(metrics)
    mlflow.log_text(manifest.to_json(), MANIFEST_NAME)
    log_dataset(dataset, "prepared")
