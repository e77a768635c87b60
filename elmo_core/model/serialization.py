"""Our own biLM file format: a directory with the model config, the weights and the warm-up.

The weights are a state dict (no pickled classes), so any later version of the code can read
them. Training checkpoints, the MLflow model and ``Elmo.from_checkpoint`` all use this format.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from elmo_core.config import ModelConfig
from elmo_core.errors import WeightsError
from elmo_core.location import atomic_write
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm import for_loading
from elmo_core.model.warm_start import read_warmup, warm_up, write_warmup

CONFIG_FILE = "model_config.json"
WEIGHTS_FILE = "model.pt"
FORMAT_VERSION = 1
# How training lays out a run (pipelines.train.checkpoint writes it): the final model in model/,
# each checkpoint's in checkpoints/step_NNNNNN/model/, and LATEST naming the newest checkpoint.
MODEL_DIR = "model"
LATEST_FILE = "LATEST"


def write_bilm_dir(bilm: BiLM, directory: str | Path) -> Path:
    """Write ``bilm`` into ``directory`` (created); each file appears whole or not at all.

    ``model_config.json``: the resolved config and the vocabulary size; ``model.pt``: the state
    dict; ``warmup.txt``: the sentences inference starts after (none: from zero).
    """
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    description = {
        "format_version": FORMAT_VERSION,
        "vocab_size": bilm.vocab_size,
        "model": bilm.config.model_dump(mode="json"),
    }
    state = {name: tensor.detach().cpu() for name, tensor in bilm.state_dict().items()}
    atomic_write(target / WEIGHTS_FILE, lambda path: torch.save(state, path))
    write_warmup(bilm, target)
    atomic_write(
        target / CONFIG_FILE, lambda path: path.write_text(json.dumps(description, indent=2))
    )
    return target


def read_bilm_dir(directory: str | Path, *, map_location: str | torch.device = "cpu") -> BiLM:
    """Rebuild the biLM :func:`write_bilm_dir` saved; a missing or foreign file: WeightsError."""
    source = Path(directory)
    config_path, weights_path = source / CONFIG_FILE, source / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise WeightsError(f"not a biLM directory: {path.name} is missing", path=source)
    try:
        description = json.loads(config_path.read_text())
        config = ModelConfig.model_validate(description["model"])
        vocab_size = description["vocab_size"]
    except (ValueError, KeyError) as err:
        raise WeightsError(f"unreadable model description: {err}", path=config_path) from None
    bilm = BiLM(for_loading(config, source), vocab_size)
    state = torch.load(weights_path, map_location=map_location, weights_only=True)
    expected = bilm.state_dict()
    wrong = [
        f"{name} {tuple(tensor.shape)} in the file, {tuple(expected[name].shape)} by the config"
        for name, tensor in state.items()
        if name in expected and tensor.shape != expected[name].shape
    ]
    if wrong:
        raise WeightsError(
            f"weights do not match {CONFIG_FILE}: {'; '.join(wrong[:3])}", path=weights_path
        )
    missing, unexpected = bilm.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise WeightsError(
            f"weights do not match {CONFIG_FILE}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}",
            path=weights_path,
        )
    return warm_up(bilm, read_warmup(source))


def find_model_dir(path: Path) -> Path:
    """Our model directory in a model, checkpoint or run directory: itself, its ``model/``, or
    that of the checkpoint its ``LATEST`` names (a run still training)."""
    if (path / CONFIG_FILE).is_file():
        return path
    if (path / MODEL_DIR / CONFIG_FILE).is_file():
        return path / MODEL_DIR
    if not path.is_dir():
        raise WeightsError("no such checkpoint directory", path=path)
    latest = path / LATEST_FILE
    if not latest.is_file():
        raise WeightsError(
            f"not a model, checkpoint or run directory (no {CONFIG_FILE}, {MODEL_DIR}/ or "
            f"{LATEST_FILE} inside)",
            path=path,
        )
    named = Path(latest.read_text(encoding="utf-8").strip())
    return find_model_dir(named if named.is_absolute() else path / named)
