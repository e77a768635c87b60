"""ELMo: deep contextualized word representations from a character-CNN biLSTM language model.

The science of the platform, usable on its own (no Ray, Prefect or MLflow)::

    from elmo_core import Elmo, batch_to_ids
"""

from elmo_core.errors import ConfigError, DataError, ElmoError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.char_cnn import CharCNN
from elmo_core.model.elmo import Elmo
from elmo_core.model.highway import Highway
from elmo_core.model.lstm import ProjectedLSTM
from elmo_core.model.scalar_mix import ScalarMix
from elmo_core.model.softmax import SampledSoftmax
from elmo_core.text.char_ids import batch_to_ids

__all__ = [
    "BiLM",
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
]
