"""Typed flow parameters: what a deployment may be given, checked before anything runs.

The models forbid unknown keys, so the server refuses a misspelt parameter or override key, with
its path, when the run is created rather than hours into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from elmo_core.analysis.task_runs import DEFAULT_FRACTIONS
from elmo_core.config import PrepareConfig, override_pattern, resolve_config
from elmo_core.errors import ConfigError
from elmo_core.tasks.seeds import DEFAULT_SEEDS
from pipelines.common.handoff import HandOn
from pipelines.common.settings import RAY_JOBS_ENV, elmo_home
from pipelines.embed.embedding_shards import Dtype
from pipelines.embed.inputs import DEFAULT_BATCH_SIZE, DEFAULT_SENTENCES_PER_SHARD
from pipelines.embed.output import Format
from pipelines.embed.vectors import Output
from pipelines.train.job_config import TrainJobConfig, Where, resolve_train_config

Preset = Literal["tiny", "mini", "small", "medium", "original"]
DEFAULT_BILM = "models:/elmo-bilm@champion"
# ``key=value`` strings whose key the config has: the JSON schema carries the pattern, so the
# Prefect server refuses ``train.max_step=50`` when the run is created, naming the entry.
PrepareOverride = Annotated[str, Field(pattern=override_pattern(PrepareConfig))]
TrainOverride = Annotated[str, Field(pattern=override_pattern(TrainJobConfig))]
Fraction = Annotated[float, Field(gt=0, le=1)]


class Params(BaseModel):
    """Base of the flow parameters: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(Params):
    """Which corpus to prepare, how, and where the dataset goes."""

    corpus: str = Field(
        description="'python-docs' (bundled sample), a path, an http(s)/s3 URL or a tarball"
    )
    format: Literal["1b-benchmark", "text", "tokenized"] = "text"
    prepare: list[PrepareOverride] = Field(
        default_factory=list, description="PrepareConfig overrides, e.g. 'max_vocab=50000'"
    )
    out: str | None = Field(None, description="dataset dir or URL; default ELMO_HOME/datasets/...")
    overwrite: bool = Field(False, description="replace another dataset found in out")

    @model_validator(mode="after")
    def _overrides_resolve(self) -> DataParams:
        self.prepare_config()
        return self

    def prepare_config(self) -> PrepareConfig:
        """The resolved prepare config: format, then the overrides."""
        try:
            return resolve_config(PrepareConfig, {"format": self.format}, None, self.prepare)
        except ConfigError as err:
            raise ValueError(f"data.prepare: {err}") from None

    def corpus_name(self) -> str:
        """The corpus's last path component (``python-docs``, ``1-billion-word...``)."""
        return _stem(self.corpus) or "corpus"

    def dataset_dir(self) -> str:
        """``out``, or a directory under ``ELMO_HOME/datasets`` named by corpus and config, so a
        different corpus or config never overwrites another dataset."""
        if self.out is not None:
            return self.out
        identity = {"corpus": self.corpus, "config": self.prepare_config().dataset_params()}
        return str(elmo_home() / "datasets" / f"{self.corpus_name()}-{_digest(identity)}")


class TrainingParams(Params):
    """The biLM to train and where: a preset, ``--set``-style overrides, Ray Train scaling; and
    which of its models is handed on to evaluate and register."""

    model: Preset = "original"
    overrides: list[TrainOverride] = Field(
        default_factory=list, description="train config overrides, e.g. 'train.max_steps=300'"
    )
    num_workers: int = Field(1, gt=0, description="Ray Train workers (one DDP rank each)")
    use_gpu: bool = False
    mode: Where | None = Field(
        None,
        description="'ray-job': submit `python -m pipelines.train` to RAY_API_SERVER_ADDRESS; "
        "'local': train in the flow's process on RAY_ADDRESS or a local Ray; "
        "default: ray-job when RAY_API_SERVER_ADDRESS is set",
    )
    hand_on: HandOn = Field(
        "best",
        description="the model evaluate and register get: 'best' (lowest validation perplexity; "
        "the final one when no validation ran) or 'final'",
    )

    _config: TrainJobConfig = PrivateAttr()

    @model_validator(mode="after")
    def _overrides_resolve(self) -> TrainingParams:
        try:
            self._config = resolve_train_config(self.model, None, self.train_overrides())
        except ConfigError as err:
            raise ValueError(f"training.overrides: {err}") from None
        return self

    def train_overrides(self) -> list[str]:
        """The overrides with the scaling fields last, as they are resolved."""
        gpu = "true" if self.use_gpu else "false"
        return [*self.overrides, f"run.num_workers={self.num_workers}", f"run.use_gpu={gpu}"]

    def job_config(self) -> TrainJobConfig:
        """The training config, resolved once when these parameters were validated."""
        return self._config

    def resolved_mode(self) -> Where:
        if self.mode is not None:
            return self.mode
        return "ray-job" if os.environ.get(RAY_JOBS_ENV) else "local"


class PretrainParams(Params):
    """The whole pipeline: corpus → biLM → registered model → task models."""

    data: DataParams
    training: TrainingParams = Field(default_factory=TrainingParams)
    tasks: list[str] = Field(
        default_factory=list, description="task config YAML paths (relative: to the repository)"
    )
    model_name: str = Field("elmo-bilm", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    seeds: list[int] = Field(
        default_factory=lambda: list(DEFAULT_SEEDS),
        min_length=1,
        description="seeds: each task trains with and without ELMo once per seed; scores are "
        "means (and standard deviations) over them",
    )
    analyze: bool = Field(
        False,
        description="run the analysis on the new biLM after adapt, over `tasks` and the bundled "
        "sense set, with `fractions` and `seeds`",
    )
    fractions: list[Fraction] = Field(
        default_factory=lambda: list(DEFAULT_FRACTIONS),
        min_length=1,
        description="the analysis' training fractions (sample-efficiency curve), each in (0, 1]",
    )


class AdaptParams(Params):
    """Adapt an already registered (or local) biLM to tasks."""

    tasks: list[str] = Field(min_length=1, description="task config YAML paths")
    bilm: str = Field(DEFAULT_BILM, description="models:/ URI, model/run directory or HDF5")
    bilm_options: str | None = Field(None, description="options.json of an HDF5 biLM")
    seeds: list[int] = Field(
        default_factory=lambda: list(DEFAULT_SEEDS),
        min_length=1,
        description="seeds: each task trains with and without ELMo once per seed",
    )


class AnalyzeParams(Params):
    """The paper's section 5 for a biLM: tasks with and without ELMo, per layer, probes."""

    tasks: list[str] = Field(
        min_length=1, description="task config YAML paths (relative: to the repository)"
    )
    bilm: str = Field(DEFAULT_BILM, description="models:/ URI, model/run directory or HDF5")
    bilm_options: str | None = Field(None, description="options.json of an HDF5 biLM")
    senses_train: str | None = Field(None, description="sense-labelled training TSV")
    senses_test: str | None = Field(None, description="sense-labelled test TSV")
    fractions: list[Fraction] = Field(
        default_factory=lambda: list(DEFAULT_FRACTIONS),
        min_length=1,
        description="training fractions of the sample-efficiency curve, each in (0, 1]",
    )
    seeds: list[int] = Field(
        default_factory=lambda: list(DEFAULT_SEEDS),
        min_length=1,
        description="seeds: every score is a mean (and standard deviation) over them",
    )

    @model_validator(mode="after")
    def _senses_paired(self) -> AnalyzeParams:
        if (self.senses_train is None) != (self.senses_test is None):
            missing = "senses_test" if self.senses_test is None else "senses_train"
            raise ValueError(f"{missing}: give senses_train and senses_test together, or neither")
        return self

    def senses(self) -> tuple[Path, Path] | None:
        """The sense-labelled (train, test) files, or None."""
        if self.senses_train is None or self.senses_test is None:
            return None
        return Path(self.senses_train), Path(self.senses_test)


class EmbedParams(Params):
    """A text → ELMo vectors per sentence, with a registered (or local) biLM. The choices are
    the embed stage's own types, so the schema lists them as enums and the server refuses
    ``output: "layers"`` before a run starts."""

    input: str = Field(
        description="one sentence per line: a file, directory, glob, URL or 'python-docs'"
    )
    bilm: str = Field(DEFAULT_BILM, description="models:/ URI, model/run directory or HDF5")
    bilm_options: str | None = Field(None, description="options.json of an HDF5 biLM")
    out: str | None = Field(None, description="output dir or URL; default ELMO_HOME/embeddings/...")
    output: Output = Field("all", description="all layers, top layer, mix (layer average), mean")
    format: Format = Field("parquet", description="parquet shards, or one HDF5 file (AllenNLP)")
    dtype: Dtype = "float32"
    batch_size: int = Field(DEFAULT_BATCH_SIZE, gt=0, description="sentences per forward pass")
    concurrency: int | None = Field(None, gt=0, description="actors; default one per GPU")
    sentences_per_shard: int = Field(DEFAULT_SENTENCES_PER_SHARD, gt=0)
    tokenized: bool = Field(False, description="lines are whitespace-tokenized")
    manifest: str | None = Field(None, description="dataset manifest.json naming the tokenizer")

    def out_dir(self) -> str:
        """``out``, or a directory under ``ELMO_HOME/embeddings`` named by the input and a digest
        of what makes the vectors, so another biLM or output never lands in the same place."""
        if self.out is not None:
            return self.out
        identity = self.model_dump(
            include={"input", "bilm", "bilm_options", "output", "format", "dtype", "tokenized"}
        )
        stem = _stem(self.input) or "input"
        return str(elmo_home() / "embeddings" / f"{stem}-{_digest(identity)}")


def _stem(location: str) -> str:
    """The last path component of a path or URL, safe as a directory name ("" if none)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(location.rstrip("/")).name).strip("-")


def _digest(identity: dict[str, Any]) -> str:
    """12 hex digits of what makes an output, for a directory name no other output shares."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
