"""Model presets by name, as plain functions (docs/architecture.md, "Configuration and presets").

Names follow the released models: ``2x4096_512_2048cnn_2xhighway`` = 2 LSTM layers of 4096 cells
projected to 512, a 2048-wide char CNN, 2 highway layers.
"""

from __future__ import annotations

from collections.abc import Callable

from elmo_core.config import RELEASED_FILTERS, CharCNNConfig, LSTMConfig, ModelConfig
from elmo_core.errors import ConfigError


def tiny() -> ModelConfig:
    """A model small enough for unit tests: every code path, a few thousand parameters."""
    return ModelConfig(
        char_cnn=CharCNNConfig(embedding_dim=4, filters=[(1, 4), (2, 8), (3, 8)], num_highway=1),
        lstm=LSTMConfig(cell_dim=32, projection_dim=16),
        num_samples=64,
    )


def mini() -> ModelConfig:
    """``2x256_64_256cnn_1xhighway``: the smallest whose layers help a task after minutes on a
    CPU (the demo's; ``tiny``'s 16-wide layers hold too little), at 1/16 of the original width."""
    return ModelConfig(
        char_cnn=CharCNNConfig(
            embedding_dim=16,
            filters=[(1, 16), (2, 16), (3, 32), (4, 64), (5, 128)],
            num_highway=1,
        ),
        lstm=LSTMConfig(cell_dim=256, projection_dim=64),
        num_samples=1024,
    )


def small() -> ModelConfig:
    """``2x1024_128_2048cnn_1xhighway``: the released small ELMo."""
    return ModelConfig(
        char_cnn=CharCNNConfig(filters=RELEASED_FILTERS, num_highway=1),
        lstm=LSTMConfig(cell_dim=1024, projection_dim=128),
    )


def medium() -> ModelConfig:
    """``2x2048_256_2048cnn_1xhighway``: the released medium ELMo."""
    return ModelConfig(
        char_cnn=CharCNNConfig(filters=RELEASED_FILTERS, num_highway=1),
        lstm=LSTMConfig(cell_dim=2048, projection_dim=256),
    )


def original() -> ModelConfig:
    """``2x4096_512_2048cnn_2xhighway``: the model of Peters et al. 2018."""
    return ModelConfig(
        char_cnn=CharCNNConfig(filters=RELEASED_FILTERS, num_highway=2),
        lstm=LSTMConfig(cell_dim=4096, projection_dim=512),
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "tiny": tiny,
    "mini": mini,
    "small": small,
    "medium": medium,
    "original": original,
}


def model_preset(name: str) -> ModelConfig:
    """The preset called ``name``; an unknown name lists the known ones."""
    try:
        return PRESETS[name]()
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"unknown model preset '{name}' (known: {known})", key="model") from None
