"""Training checkpoints: everything needed to continue a run exactly.

A checkpoint is one directory to which every rank adds its part::

    model/           the biLM in our format (save_bilm)              rank 0
    trainer.pt       optimiser state, step, best validation, MLflow run id, curves   rank 0
    rank_{r}.pt      rank r's RNG states, both streams' positions, carried LSTM states

With the same seed, N steps straight equal k steps + resume + N − k steps: the weights and
optimiser come from the shared files, the data position, dropout/sampling RNG and LSTM states of
every rank from its own file. Where checkpoints are kept, and which are complete, is
:mod:`pipelines.train.checkpoint_store`'s business.

Continued pretraining starts from weights rather than a checkpoint (:func:`initial_bilm`): any biLM
:mod:`pipelines.models.bilm_loader` resolves; a softmax whose vocabulary size differs from the
dataset's is re-initialised.
"""

from __future__ import annotations

import logging
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_core.config import ModelConfig
from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM, BiLMState
from elmo_core.model.lstm import LSTMState
from elmo_core.model.serialization import save_bilm
from pipelines.models.bilm_loader import BiLMReference, load_bilm

log = logging.getLogger(__name__)

MODEL_DIR = "model"
TRAINER_FILE = "trainer.pt"


@dataclass
class SharedState:
    """What every rank agrees on, written once by rank 0."""

    step: int
    world_size: int
    mlflow_run_id: str | None = None
    best_perplexity: float | None = None
    validations_since_best: int = 0
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass
class RankState:
    """One rank's position: RNG, the two streams' ``state_dict()`` s, the carried LSTM states."""

    rng: dict[str, Any]
    forward_stream: dict[str, Any]
    backward_stream: dict[str, Any]
    lstm_state: BiLMState | None


@dataclass
class LoadedCheckpoint:
    model_dir: Path
    optimizer: dict[str, Any]
    shared: SharedState
    rank: RankState | None  # None when this rank had no file (the world size changed)


def write_checkpoint(
    directory: Path,
    rank: int,
    *,
    bilm: BiLM,
    optimizer: torch.optim.Optimizer,
    shared: SharedState,
    rank_state: RankState,
) -> Path:
    """Write this rank's part of a checkpoint into ``directory`` (rank 0 adds the shared files)."""
    directory.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        save_bilm(bilm, directory / MODEL_DIR)
        torch.save(
            {"optimizer": optimizer.state_dict(), "shared": asdict(shared)},
            directory / TRAINER_FILE,
        )
    lstm = None
    if rank_state.lstm_state is not None:
        lstm = [tuple(t.detach().cpu() for t in state) for state in rank_state.lstm_state]
    torch.save(
        {
            "rng": rank_state.rng,
            "forward_stream": _tensors_for_arrays(rank_state.forward_stream),
            "backward_stream": _tensors_for_arrays(rank_state.backward_stream),
            "lstm_state": lstm,
        },
        directory / rank_file(rank),
    )
    return directory


def read_checkpoint(
    directory: Path, rank: int, world_size: int, device: torch.device
) -> LoadedCheckpoint:
    """This rank's view of a checkpoint; its ``rank`` part is None if the world size changed."""
    trainer = torch.load(directory / TRAINER_FILE, map_location=device, weights_only=True)
    shared = SharedState(**trainer["shared"])
    shared.curves = {
        name: [(int(step), float(value)) for step, value in points]
        for name, points in shared.curves.items()
    }
    rank_state = None
    path = directory / rank_file(rank)
    if shared.world_size == world_size:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        lstm = None
        if saved["lstm_state"] is not None:
            forward, backward = (
                LSTMState(h.to(device), c.to(device)) for h, c in saved["lstm_state"]
            )
            lstm = (forward, backward)
        rank_state = RankState(
            saved["rng"], saved["forward_stream"], saved["backward_stream"], lstm
        )
    return LoadedCheckpoint(directory / MODEL_DIR, trainer["optimizer"], shared, rank_state)


def initial_bilm(config: ModelConfig, vocab_size: int, source: BiLMReference | None) -> BiLM:
    """A fresh biLM, or one holding the weights of ``source`` (continued pretraining).

    ``source`` was resolved and pinned by the driver (:mod:`pipelines.models.bilm_loader`); each
    worker loads it here. The token encoder and LSTMs must match ``config`` in shape; the softmax
    is kept only when the source has one of ``vocab_size`` rows (a new vocabulary starts from a
    new softmax).
    """
    bilm = BiLM(config, vocab_size)
    if source is None:
        return bilm
    with tempfile.TemporaryDirectory(prefix="elmo-init-from-") as scratch:
        start = load_bilm(source, Path(scratch)).bilm
    state = start.state_dict()
    if start.vocab_size != vocab_size:
        log.warning(
            "softmax re-initialised: %s has vocabulary size %s, the dataset %d",
            source.location,
            start.vocab_size,
            vocab_size,
        )
        state = {k: v for k, v in state.items() if not k.startswith("softmax.")}
    try:
        missing, unexpected = bilm.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise WeightsError(
            f"weights do not fit the model config: {err}", path=source.location
        ) from None
    missing = [name for name in missing if not name.startswith("softmax.")]
    if missing or unexpected:
        raise WeightsError(
            f"weights do not fit the model config: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}",
            path=source.location,
        )
    return bilm


def rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def _tensors_for_arrays(value: Any) -> Any:
    """Stream states hold NumPy arrays; as tensors they load with ``weights_only=True``."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {key: _tensors_for_arrays(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_tensors_for_arrays(item) for item in value)
    return value


def capture_rng() -> dict[str, Any]:
    """torch, NumPy and Python RNG states (dropout draws from torch's; candidates travel with the
    stream state)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            position,
            has_gauss,
            cached,
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
