"""``elmo embed`` in the driver: every user mistake is one line, found before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from elmo_core.errors import ConfigError, DataError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from pipelines.embed import stage as embed_stage
from pipelines.embed.cli import main
from pipelines.embed.stage import EmbedResult, summary_line, tokenizer_description
from pipelines.serving.bilm_loader import resolve_bilm


class RayStarted(AssertionError):
    """The stage reached Ray, which these mistakes must not."""


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh ELMO_HOME, and Ray out of reach: the stage's connect fails the test if called
    (another test of the session may have started Ray, so ``ray.is_initialized`` cannot tell)."""
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def connect_ray() -> None:
        raise RayStarted("the embed stage connected to Ray")

    monkeypatch.setattr(embed_stage, "connect_ray", connect_ray)
    return tmp_path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    bilm = BiLM(tiny().model_copy(update={"num_samples": 4}), 20)
    return write_bilm_dir(bilm, tmp_path_factory.mktemp("model") / "bilm")


def _embed(home: Path, *args: str) -> int:
    return main(["--input", str(home / "in.txt"), "--out", str(home / "out"), *args])


def test_a_model_path_that_does_not_exist_is_named(home, capsys):
    (home / "in.txt").write_text("a b\n")

    assert _embed(home, "--bilm", str(home / "no-model"), "--tokenized") == 2

    err = capsys.readouterr().err
    assert f"error: {home / 'no-model'}: no such checkpoint directory" in err
    assert "Traceback" not in err


def test_a_line_that_is_not_utf8_is_named_before_ray_starts(home, model_dir, capsys):
    (home / "in.txt").write_bytes(b"good line\n\xc3\x28 bad\n")

    assert _embed(home, "--bilm", str(model_dir), "--tokenized") == 2

    err = capsys.readouterr().err
    assert f"error: {home / 'in.txt'}:2: not UTF-8" in err
    assert not (home / "out").exists()


def test_raw_text_with_a_biLM_that_names_no_tokenizer_asks_for_a_manifest(home, model_dir, capsys):
    (home / "in.txt").write_text("Hello, world.\n")

    assert _embed(home, "--bilm", str(model_dir)) == 2

    err = capsys.readouterr().err
    assert "key 'manifest'" in err and "give --manifest" in err and "--tokenized" in err


def test_an_input_that_does_not_exist_is_named(home, model_dir, capsys):
    assert _embed(home, "--bilm", str(model_dir), "--tokenized") == 2

    assert f"error: {home / 'in.txt'}: no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "key"),
    [
        ("--output", "layers", "output"),
        ("--dtype", "int8", "dtype"),
        ("--batch-size", "0", "batch_size"),
    ],
)
def test_a_bad_choice_or_number_is_named_by_its_key(home, model_dir, capsys, option, value, key):
    (home / "in.txt").write_text("a\n")

    assert _embed(home, "--bilm", str(model_dir), "--tokenized", option, value) == 2

    assert f"key '{key}'" in capsys.readouterr().err


def test_the_tokenizer_comes_from_the_manifest_or_is_whitespace_for_tokenized_lines(
    tmp_path, model_dir
):
    moses = {"name": "moses", "lang": "en", "escape": False, "aggressive_dash_splits": False}
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": moses}))
    reference = resolve_bilm(model_dir)

    assert tokenizer_description(reference, False, str(tmp_path)) == moses
    assert tokenizer_description(reference, True, None)["name"] == "whitespace"
    with pytest.raises(ConfigError, match="key 'manifest'"):
        tokenizer_description(reference, True, str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"tokenizer": {"name": "bpe"}}))
    with pytest.raises(DataError, match="unknown tokenizer 'bpe'"):
        tokenizer_description(reference, False, str(tmp_path / "manifest.json"))


def test_the_summary_line_says_what_was_done_and_what_was_there():
    result = EmbedResult("/out", ["/out/a", "/out/b"], 10, 2, 4, 30, 1, 2, 2.0, "run")

    line = summary_line(result)

    assert line.startswith("embedded 4 of 10 sentences (30 tokens) into 1 new shards, 2 already")
    assert "2 empty lines skipped" in line and line.endswith("/out/a and 1 more")
