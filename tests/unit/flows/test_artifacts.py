"""The flow's log lines: counts that say what they count, and links Prefect's UI can follow; the
embed flow's summary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elmo_core.data.reader import load_manifest
from flows.artifacts import dataset_lines, embed_markdown, run_link_line
from pipelines.embed.stage import EmbedResult
from pipelines.tracking.stage_runs import ui_url

# How Prefect's UI (3.8, server/ui-v2, its run-logs component) finds links in a log message,
# which it otherwise shows as plain text: markdown's [text](url) is not rendered.
PREFECT_UI_LINK = re.compile(r"(https?:\/\/[^\s/$.?#].[^\s)\"('[{<>}]*)")


def test_the_dataset_lines_say_what_each_count_is(make_dataset) -> None:
    dataset = make_dataset(["a b c", "a b d", "a b"], heldout={"h.txt": ["a x y"]})

    lines = dataset_lines(load_manifest(dataset))

    assert lines == [
        "dataset train: 3 sentences, 8 tokens, OOV 0.00%",
        "dataset heldout: 1 sentences, 3 tokens, OOV 66.67%",
        "vocabulary 7 words (<S>, </S>, <UNK> included) of the 9 word types in train and heldout",
    ]


def test_a_run_link_is_a_bare_url_that_prefects_ui_links_whole() -> None:
    url = ui_url("3", "0123456789abcdef0123456789abcdef", server="http://127.0.0.1:5000")

    line = run_link_line("evaluate run", url)

    assert line == f"evaluate run in MLflow: {url}"
    assert PREFECT_UI_LINK.findall(line) == [url]


def test_the_embed_summary_says_where_the_vectors_are_and_what_this_run_did(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))  # where run_links looks
    result = EmbedResult(
        out="/data/vectors",
        files=["part-00000.parquet", "part-00001.parquet"],
        num_sentences=12_000,
        num_empty_lines=3,
        num_embedded=2_000,
        num_tokens=24_000,
        shards_written=1,
        shards_skipped=1,
        seconds=2.0,
        run_id="r1",
    )

    assert embed_markdown(result, {}).splitlines()[:6] == [
        "# ELMo vectors of 12,000 sentences",
        "",
        "- output: `/data/vectors` (2 files)",
        "- this run: 2,000 sentences, 24,000 tokens, 1 shards written, 1 already there",
        "- empty lines skipped: 3",
        "",
    ]
