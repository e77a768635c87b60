"""Own corpora in other languages, prepared → trained (the ``tiny`` preset, a few steps of a
worker's data path and step in this process; on Ray, test_train.py's) → embedded by the biLM
pyfunc, which must tokenize raw text as the manifest says.

German raw text goes through German Moses (``--set tokenizer.lang=de``): "z.B." and "Nr." keep
their sentences together and their periods; its embedder's biLM is untrained, since what is
checked there is the manifest's tokenizer. Chinese, already segmented into words separated by
spaces, goes through ``--format tokenized`` untouched, and trains: characters of three bytes each
in UTF-8 through the shards, training's character inputs and the embedder.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from elmo_core.config import TrainConfig
from elmo_core.data.manifest import MANIFEST_NAME, load_manifest
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.training.local_run import step_results
from elmo_core.training.step import TrainingStep
from pipelines.prepare.cli import main as prepare_main
from pipelines.serving.bilm_pyfunc import BiLMEmbedder

pytestmark = pytest.mark.integration

# Vocabularies above the tiny preset's 64 sampled candidates.
GERMAN_STEMS = ["Bär", "Straße", "Fuß", "Größe", "Tür", "Öl", "Käse", "Übung", "Mädchen", "Schloß"]
GERMAN_TAILS = ["", "haus", "weg", "zeit", "tür", "größe", "übung", "maß"]
CJK_CHARS = "北京欢迎你我们学习中文今天天气很好朋友喜欢吃饭喝茶看书写字电脑手机学校老师"


def _german_corpus(rng: random.Random, num_lines: int) -> str:
    """Three sentences a line: 'z.B.' before a noun and 'Nr.' before a number split none."""
    nouns = [stem + tail for stem in GERMAN_STEMS for tail in GERMAN_TAILS]
    lines = []
    for _ in range(num_lines):
        first, second, third = rng.sample(nouns, 3)
        lines.append(
            f"Der {first} ist z.B. {second} in Nr. {rng.randint(1, 9)} der Liste. "
            f"Wie geht's dem {third}? Größer als {rng.choice(nouns)}."
        )
    return "\n".join(lines) + "\n"


def _chinese_corpus(rng: random.Random, num_lines: int) -> str:
    """Words of one or two characters, separated by spaces, a sentence a line."""
    words = [a + b for a in CJK_CHARS[:10] for b in CJK_CHARS[10:18]] + list(CJK_CHARS)
    return "".join(
        " ".join([*rng.choices(words, k=rng.randint(3, 9)), "。"]) + "\n" for _ in range(num_lines)
    )


def _prepared(root: Path, name: str, text: str, options: list[str]) -> Path:
    corpus, dataset = root / f"{name}.txt", root / f"{name}-dataset"
    corpus.write_text(text, encoding="utf-8")
    argv = ["--corpus", str(corpus), "--out", str(dataset), "--set", "heldout_fraction=0.1"]
    assert prepare_main([*argv, *options]) == 0
    return dataset


def _embedder(dataset: Path, model_dir: str | Path) -> BiLMEmbedder:
    embedder = BiLMEmbedder()
    embedder.load(model_dir, dataset / MANIFEST_NAME)
    return embedder


def _trained_embedder(dataset: Path, root: Path) -> BiLMEmbedder:
    torch.manual_seed(0)
    bilm = BiLM(tiny(), load_manifest(str(dataset)).vocab.size).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=4, unroll_steps=5))
    results = step_results(step, str(dataset), torch.device("cpu"))
    losses = [float(result.output.loss.detach()) for result in itertools.islice(results, 4)]
    results.close()
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    return _embedder(dataset, write_bilm_dir(bilm.eval(), root / "trained"))


def _embedded(embedder: BiLMEmbedder, column: str, value: object) -> tuple[list[str], np.ndarray]:
    out = embedder.predict(None, pd.DataFrame({column: [value]}))
    return list(out["tokens"][0]), np.asarray(out["embeddings"][0])  # (L, T, 2P)


def test_a_german_corpus_is_prepared_and_embedded_with_german_moses(tmp_path) -> None:
    text = _german_corpus(random.Random(0), 150)
    dataset = _prepared(tmp_path, "de", text, ["--format", "text", "--set", "tokenizer.lang=de"])
    manifest = load_manifest(str(dataset))
    assert manifest.tokenizer["name"] == "moses" and manifest.tokenizer["lang"] == "de"
    assert manifest.splits["train"].num_sentences + manifest.splits["heldout"].num_sentences == 450

    bilm = write_bilm_dir(BiLM(tiny(), manifest.vocab.size), tmp_path / "bilm")
    embedder = _embedder(dataset, bilm)
    tokens, vectors = _embedded(embedder, "sentence", "Das ist z.B. ein Test für Nr. 5 im Haus.")
    assert tokens == ["Das", "ist", "z.B.", "ein", "Test", "für", "Nr.", "5", "im", "Haus", "."]
    assert vectors.shape[:2] == (embedder.bilm.num_layers, len(tokens))
    assert np.isfinite(vectors).all()
    tokens, _ = _embedded(embedder, "sentence", "Wie geht's dem Bärhaus?")
    assert tokens == ["Wie", "geht", "'", "s", "dem", "Bärhaus", "?"]  # German, not English 's


def test_a_segmented_chinese_corpus_is_prepared_trained_and_embedded_as_tokenized(
    store, tmp_path
) -> None:
    text = _chinese_corpus(random.Random(1), 400)
    dataset = _prepared(tmp_path, "zh", text, ["--format", "tokenized"])
    manifest = load_manifest(str(dataset))
    assert manifest.format == "tokenized" and manifest.tokenizer["name"] == "whitespace"
    assert manifest.vocab.size > 64

    embedder = _trained_embedder(dataset, tmp_path)
    tokens, vectors = _embedded(embedder, "sentence", "北京 欢迎 你们 。")
    assert tokens == ["北京", "欢迎", "你们", "。"]
    assert vectors.shape[:2] == (embedder.bilm.num_layers, 4) and np.isfinite(vectors).all()
    assert not np.allclose(vectors[0, 0], vectors[0, 1])  # distinct characters, distinct vectors
    given, same = _embedded(embedder, "tokens", tokens)
    assert given == tokens and np.allclose(same, vectors)
