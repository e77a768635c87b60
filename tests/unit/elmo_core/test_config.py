import re

import pytest

from elmo_core.config import ModelConfig, PrepareConfig, parse_override, resolve_config
from elmo_core.errors import ConfigError
from elmo_core.presets import PRESETS, model_preset


def test_presets_have_the_released_sizes():
    original = model_preset("original")
    assert original.char_cnn.num_filters == 2048
    assert original.char_cnn.num_highway == 2
    assert (original.lstm.cell_dim, original.lstm.projection_dim) == (4096, 512)
    assert model_preset("small").lstm.cell_dim == 1024
    assert model_preset("medium").lstm.projection_dim == 256
    assert set(PRESETS) == {"tiny", "mini", "small", "medium", "original"}


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown model preset 'huge'.*original"):
        model_preset("huge")


def test_resolution_order_is_preset_then_yaml_then_overrides(tmp_path):
    config_file = tmp_path / "model.yaml"
    config_file.write_text("lstm:\n  cell_dim: 64\n  projection_dim: 32\ndropout: 0.2\n")
    preset = model_preset("tiny").model_dump()
    resolved = resolve_config(ModelConfig, preset, config_file, ["dropout=0.3", "lstm.cell_clip=5"])
    assert resolved.lstm.cell_dim == 64
    assert resolved.dropout == 0.3
    assert resolved.lstm.cell_clip == 5.0
    assert resolved.char_cnn.embedding_dim == 4  # from the preset


def test_misspelt_key_names_its_dotted_path_and_source(tmp_path):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text("lstm:\n  cel_dim: 64\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*'lstm.cel_dim'"):
        resolve_config(ModelConfig, {}, config_file)
    with pytest.raises(ConfigError, match=r"override 'lstm.num_layers=two'.*'lstm.num_layers'"):
        resolve_config(ModelConfig, {}, None, ["lstm.num_layers=two"])


def test_invalid_yaml_names_the_line(tmp_path):
    config_file = tmp_path / "broken.yaml"
    config_file.write_text("lstm:\n  cell_dim: 64\n bad: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+"):
        resolve_config(ModelConfig, {}, config_file)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="not found"):
        resolve_config(ModelConfig, {}, "/nonexistent/config.yaml")


def test_override_syntax():
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override("flag=true") == ("flag", True)
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("novalue")
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("a..b=1")


def test_prepare_config_rejects_conflicting_vocab_options():
    with pytest.raises(ConfigError, match="vocab_file excludes"):
        resolve_config(PrepareConfig, {"vocab_file": "v.txt", "max_vocab": 10})


def test_override_keys_list_sections_and_fields_and_the_pattern_matches_only_those() -> None:
    from pydantic import BaseModel

    from elmo_core.config import override_keys, override_pattern

    class Inner(BaseModel):
        depth: int = 1

    class Outer(BaseModel):
        name: str = "x"
        inner: Inner = Inner()
        maybe: Inner | None = None

    assert override_keys(Outer) == ["name", "inner", "inner.depth", "maybe", "maybe.depth"]
    pattern = override_pattern(Outer)
    assert re.search(pattern, "inner.depth=2") and re.search(pattern, "name=a=b")
    assert not re.search(pattern, "inner.dept=2") and not re.search(pattern, "innerXdepth=2")
