"""prepare into s3:// and read back, against a local moto S3 server (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.reader import iter_sentences, load_manifest, load_word_types

pytestmark = pytest.mark.integration


def test_prepare_writes_to_s3_and_the_reader_streams_it_back(s3_endpoint, tmp_path):
    from types import SimpleNamespace

    from pipelines.prepare.stage import prepare_files

    train, heldout = (
        tmp_path / "news.en-00001-of-00100",
        tmp_path / "news.en.heldout-00000-of-00050",
    )
    train.write_text("".join(f"the cat sat on mat {i}\n" for i in range(120)))
    heldout.write_text("the dog sat\na cat\n")
    corpus = SimpleNamespace(source=str(tmp_path), train=[train], heldout=[heldout])
    cfg = PrepareConfig(format="1b-benchmark", sentences_per_shard=50, sentences_per_row_group=20)
    url = "s3://datasets/tiny"
    first = prepare_files(cfg, corpus, url)
    manifest = load_manifest(url)
    assert manifest == first.manifest
    assert manifest.splits["train"].num_sentences == 120
    shards = manifest.splits["train"].shards
    read = [
        sum(batch.num_sentences for batch in iter_sentences(url, "train", rank=rank, world_size=2))
        for rank in range(2)
    ]
    # whole shards, dealt round-robin: each rank reads its shards' sentences, together all of them
    assert read == [sum(shard.num_sentences for shard in shards[rank::2]) for rank in range(2)]
    assert sum(read) == 120 and len(shards) == 3  # 120 sentences, at most 50 a shard
    held = list(iter_sentences(url, "heldout", files=["heldout-00000"]))
    assert held[0].lines.tolist() == [1, 2]
    assert len(load_word_types(url)) == manifest.word_types.num_types
    again = prepare_files(cfg, corpus, url)
    assert (again.num_shards_written, again.num_shards_skipped) == (0, first.num_shards_written)
    staging = Path(tmp_path / "home" / "cache" / "prepare")
    assert not staging.exists() or not any(staging.iterdir())
