"""benchmarks/bench_embed.py's helpers on a few sentences of its own: the script cannot rot."""

import json

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from pipelines.embed.vectors import embed_sentences


@pytest.fixture(scope="module")
def bench():
    from benchmarks import bench_embed

    return bench_embed


def test_sentences_come_from_the_books_split_and_tokenized(bench, tmp_path):
    book = "It is a truth universally\nacknowledged. Mr. Darcy\nsmiled.\n\nShe laughed!\n"
    (tmp_path / "book.txt").write_text(book, encoding="utf-8")

    sentences = bench.load_sentences(tmp_path, 10)

    assert sentences == [
        ["It", "is", "a", "truth", "universally", "acknowledged", "."],
        ["Mr.", "Darcy", "smiled", "."],
        ["She", "laughed", "!"],
    ]
    assert bench.load_sentences(tmp_path, 2) == sentences[:2]


def test_the_baseline_gives_what_the_stage_computes(bench):
    torch.manual_seed(0)
    bilm = BiLM(tiny()).eval()
    sentences = [["a", "b", "c"], ["d"], ["e", "f"]]

    reference = bench.baseline(bilm, sentences, batch_size=2)
    candidate = embed_sentences(bilm, sentences, "all", batch_size=3)

    assert [r.shape for r in reference] == [(3, 3, 32), (3, 1, 32), (3, 2, 32)]
    assert bench.max_difference(reference, candidate) < 1e-5


def test_without_the_shared_data_it_skips_with_a_json_last_line(bench, tmp_path, capsys):
    assert bench.main(["--data-root", str(tmp_path)]) == 0

    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == {"benchmark": "embed", "skipped": True}
