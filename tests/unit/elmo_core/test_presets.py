from __future__ import annotations

import pytest

from elmo_core.config import RELEASED_FILTERS
from elmo_core.errors import ConfigError
from elmo_core.presets import PRESETS, model_preset


@pytest.mark.parametrize(
    ("name", "cells", "projection", "highway"),
    [("small", 1024, 128, 1), ("medium", 2048, 256, 1), ("original", 4096, 512, 2)],
)
def test_the_released_presets_have_the_released_models_sizes(
    name: str, cells: int, projection: int, highway: int
) -> None:
    config = model_preset(name)
    assert (config.lstm.cell_dim, config.lstm.projection_dim) == (cells, projection)
    assert (config.lstm.num_layers, config.char_cnn.num_highway) == (2, highway)
    assert config.char_cnn.filters == RELEASED_FILTERS
    assert (config.lstm.cell_clip, config.lstm.proj_clip) == (3.0, 3.0)  # bilm-tf's clips


def test_each_call_builds_a_fresh_config() -> None:
    assert all(PRESETS[name]() is not PRESETS[name]() for name in PRESETS)


def test_an_unknown_preset_names_the_key_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown model preset 'huge' \(known: medium, mini,"):
        model_preset("huge")
