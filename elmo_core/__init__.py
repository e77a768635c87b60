"""ELMo: deep contextualized word representations from a character-CNN biLSTM language model.

Usable without Ray, Prefect or MLflow. The model classes are imported on first use, so tools that
only read or write data (``elmo prepare``'s workers) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from elmo_core.errors import ConfigError, DataError, ElmoError, WeightsError

_LAZY = {
    "BiLM": "elmo_core.model.bilm",
    "BiLMOutput": "elmo_core.model.bilm",
    "CharCNN": "elmo_core.model.char_cnn",
    "Elmo": "elmo_core.model.elmo",
    "Highway": "elmo_core.model.highway",
    "ProjectedLSTM": "elmo_core.model.lstm.reference",
    "SampledSoftmax": "elmo_core.model.softmax",
    "ScalarMix": "elmo_core.model.scalar_mix",
    "batch_to_ids": "elmo_core.text.char_ids",
    "evaluate_perplexity": "elmo_core.perplexity",
    "read_bilm_dir": "elmo_core.model.serialization",
    "write_bilm_dir": "elmo_core.model.serialization",
}

if TYPE_CHECKING:
    from elmo_core.model.bilm import BiLM, BiLMOutput
    from elmo_core.model.char_cnn import CharCNN
    from elmo_core.model.elmo import Elmo
    from elmo_core.model.highway import Highway
    from elmo_core.model.lstm.reference import ProjectedLSTM
    from elmo_core.model.scalar_mix import ScalarMix
    from elmo_core.model.serialization import read_bilm_dir, write_bilm_dir
    from elmo_core.model.softmax import SampledSoftmax
    from elmo_core.perplexity import evaluate_perplexity
    from elmo_core.text.char_ids import batch_to_ids


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elmo_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BiLM",
    "BiLMOutput",
    "CharCNN",
    "ConfigError",
    "DataError",
    "Elmo",
    "ElmoError",
    "Highway",
    "ProjectedLSTM",
    "SampledSoftmax",
    "ScalarMix",
    "WeightsError",
    "batch_to_ids",
    "evaluate_perplexity",
    "read_bilm_dir",
    "write_bilm_dir",
]
