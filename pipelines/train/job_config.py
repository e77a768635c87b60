"""The training job's configuration: what to train (model, recipe) and how to run it (Ray, storage).

The ``run`` section is orchestration, so it lives here and not in ``elmo_core``; the run name's
hash leaves it out, so the same training re-run with more workers or on other storage resumes the
same run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationInfo, field_validator

from elmo_core.config import ModelConfig, StrictModel, TrainConfig, resolve_config
from elmo_core.errors import ConfigError
from elmo_core.model.lstm import training_defaults
from elmo_core.presets import PRESETS, model_preset
from pipelines.common.settings import elmo_home

# How the model and the step run, not what they are: left out of the run name.
RUNTIME_MODEL_KEYS = {"lstm_impl", "batch_directions", "conv_impl", "cpu_highway_bf16"}
RUNTIME_TRAIN_KEYS = {"capture_step", "shape_buckets"}
REPORTING_TRAIN_KEYS = {"warn_rise", "warn_parting"}  # what validation warns of, not the training
# Where a run trains: from the calling process (on RAY_ADDRESS or a local Ray), or as a Ray Job.
Where = Literal["local", "ray-job"]


class RunConfig(StrictModel):
    """Where and how a training run executes (Ray Train scaling, storage, fault tolerance)."""

    num_workers: int = Field(1, gt=0, description="Ray Train workers (one DDP rank each)")
    use_gpu: bool = False
    cpus_per_worker: int = Field(1, gt=0)
    name: str | None = Field(None, description="default: bilm-<hash of config and dataset>")
    storage_path: str | None = Field(None, description="local dir or s3://; default ELMO_HOME/runs")
    max_failures: int = Field(
        3, ge=-1, description="worker-group restarts from the last checkpoint"
    )
    checkpoints_to_keep: int = Field(2, gt=0)
    grad_exchange: Literal["union", "sparse", "dense"] = Field(
        "union",
        description="how workers average the softmax's row gradients: union, a block of the rows "
        "any worker touches, all-reduced; sparse, each worker's padded rows all-gathered (the "
        "earlier design); dense, the whole matrix all-reduced (the benchmark baseline)",
    )
    data_workers: Literal[0, 1, 2] | None = Field(
        None,
        description="processes per worker building batches ahead: 0 none, 1 both directions, "
        "2 one per direction; default 2 on a GPU, 0 on CPU",
    )


class TrainJobConfig(StrictModel):
    """The resolved configuration of one training run, logged to MLflow as it is."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    run: RunConfig = Field(default_factory=RunConfig, validate_default=True)

    @field_validator("run")
    @classmethod
    def _captured_step_on_one_gpu(cls, run: RunConfig, info: ValidationInfo) -> RunConfig:
        train = info.data.get("train")
        if train is not None and train.capture_step and (not run.use_gpu or run.num_workers > 1):
            raise ValueError(
                "train.capture_step captures one GPU worker's step: set run.use_gpu=true and "
                "run.num_workers=1, or train.capture_step=false"
            )
        return run


# A GPU run's defaults, beneath the preset, the model file, the YAML and the overrides: the LSTM
# the dispatch table chooses for CUDA (elmo_core.model.lstm.CHOICES), and 8× bilm-tf's 128 rows
# at lr 0.2·√8, the square-root rule (experiments/batch_recipe.py; checked at `original` size by
# `gpu_suite.sh recipe`). Set train.lr with train.batch_size: 0.2·√(rows/128).
GPU_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": training_defaults("cuda"),
    "train": {"batch_size": 1024, "lr": round(0.2 * math.sqrt(1024 / 128), 4)},
}


# One GPU worker's step captured whole, with the shape buckets a capture needs: faster than graphed
# at 128 and 1,024 rows (benchmarks/results/gpu_captured-2026-11-28.md). Several workers exchange
# the softmax rows through the host between the backward and the clip, which no graph holds.
ONE_GPU_DEFAULTS: dict[str, Any] = {"shape_buckets": True, "capture_step": True}


def resolve_train_config(
    model: str | None = None, config_file: str | Path | None = None, overrides: Sequence[str] = ()
) -> TrainJobConfig:
    """``--model`` (a preset name or a YAML/JSON file of model keys) → YAML → overrides.

    Without ``--model`` the model is :class:`ModelConfig`'s defaults (the original ELMo). With
    ``run.use_gpu`` the keys the user left unset take :data:`GPU_DEFAULTS`, and with one worker
    :data:`ONE_GPU_DEFAULTS` too (unless the user turned the shape buckets off).
    """
    preset: dict[str, Any] = {}
    if model is not None:
        preset["model"] = _model_section(model)
    cfg = resolve_config(TrainJobConfig, preset, config_file, overrides)
    if not cfg.run.use_gpu:
        return cfg
    beneath = copy.deepcopy(GPU_DEFAULTS)
    beneath["model"].update(preset.get("model", {}))
    buckets_off = "shape_buckets" in cfg.train.model_fields_set and not cfg.train.shape_buckets
    if cfg.run.num_workers == 1 and not buckets_off:
        beneath["train"].update(ONE_GPU_DEFAULTS)
    return resolve_config(TrainJobConfig, beneath, config_file, overrides)


def _model_section(model: str) -> dict[str, Any]:
    """The keys the preset or file sets (not the defaults, so the GPU's can apply beneath)."""
    if model in PRESETS:
        return model_preset(model).model_dump(mode="json", exclude_unset=True)
    path = Path(model)
    if not path.is_file():
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"neither a preset ({known}) nor a file: '{model}'", key="model")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML: {err}", key="model", source=str(path)) from None
    if isinstance(loaded, dict) and "format_version" in loaded and "model" in loaded:
        loaded = loaded["model"]  # our model directory's model_config.json
    if not isinstance(loaded, dict):
        raise ConfigError("a model file must be a mapping of ModelConfig keys", source=str(path))
    return loaded


def run_name(cfg: TrainJobConfig, dataset_sha256: str, init_from: str | None = None) -> str:
    """``cfg.run.name``, or ``bilm-<12 hex>`` of the model and train sections, start and data.

    How the model and the step run are left out (:data:`RUNTIME_MODEL_KEYS`: the LSTM and
    convolution kernels, the CPU highway's dtype; :data:`RUNTIME_TRAIN_KEYS`: a captured step and
    its shape buckets, which leave the loss and updates exact): every variant has the same
    parameters and passes the same parity tests, so a run resumes under another; so are the
    validation warnings' thresholds.
    """
    if cfg.run.name:
        return cfg.run.name
    identity = {
        "model": cfg.model.model_dump(mode="json", exclude=RUNTIME_MODEL_KEYS),
        "train": cfg.train.model_dump(
            mode="json", exclude=RUNTIME_TRAIN_KEYS | REPORTING_TRAIN_KEYS
        ),
        "init_from": init_from,
        "dataset": dataset_sha256,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"bilm-{digest[:12]}"


def storage_root(cfg: RunConfig) -> str:
    """Where run directories live: ``run.storage_path`` or ``ELMO_HOME/runs`` (absolute)."""
    if cfg.storage_path is None:
        return str(elmo_home() / "runs")
    if "://" in cfg.storage_path:
        return cfg.storage_path.rstrip("/")
    return str(Path(cfg.storage_path).expanduser().resolve())
