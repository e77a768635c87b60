"""``elmo prepare``: its options reach the dataset, what it prints, and user errors as one line."""

from __future__ import annotations

import re

import pytest

from elmo_core.data.reader import load_manifest
from pipelines.prepare.cli import main


def test_command_line_prepares_a_text_file_and_reports_user_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    text = tmp_path / "a.txt"
    text.write_text("Hello world. This is a test.\nAnother line here.\n" * 20)
    out = tmp_path / "out"
    argv = [
        "--corpus",
        str(text),
        "--out",
        str(out),
        "--format",
        "text",
        "--seed",
        "1",
        "--set",
        "sentences_per_shard=10",
        "--set",
        "heldout_fraction=0.1",
    ]
    assert main(argv) == 0
    manifest = load_manifest(str(out))
    assert manifest.params.seed == 1 and manifest.params.sentences_per_shard == 10
    printed = capsys.readouterr().out
    assert "train: " in printed
    assert re.search(r"phases: count [\d.]+s, vocabulary [\d.]+s, encode [\d.]+s, shuffle", printed)
    assert (
        main(["--corpus", str(tmp_path / "nope.txt"), "--out", str(out), "--format", "text"]) == 2
    )
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--set", "tokenizer.lang=xx"], r"key 'tokenizer\.lang': Input should be 'as', 'bn'"),
        (
            ["--format", "tokenized", "--set", "tokenizer.lang=de"],
            r"tokenizer\.lang applies to format 'text' \(Moses\) only",
        ),
    ],
)
def test_command_line_refuses_a_language_it_cannot_use_naming_tokenizer_lang(
    tmp_path, capsys, monkeypatch, options, message
):
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    text = tmp_path / "a.txt"
    text.write_text("Hallo Welt .\n")
    argv = ["--corpus", str(text), "--out", str(tmp_path / "out"), *options]
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
