"""ELMo: deep contextualized word representations from a character-CNN biLSTM language model.

The science of the platform, usable on its own (no Ray, Prefect or MLflow)::

    from elmo_core import Elmo, batch_to_ids
"""

from elmo_core.errors import ConfigError, DataError, ElmoError, WeightsError
from elmo_core.text.char_ids import batch_to_ids

__all__ = [
    "ConfigError",
    "DataError",
    "ElmoError",
    "WeightsError",
    "batch_to_ids",
]
