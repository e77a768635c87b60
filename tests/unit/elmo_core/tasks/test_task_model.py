"""TaskModel: vocabulary, flat encoding and batching, mixes, and cached = live activations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM
from elmo_core.tasks.dataset import PairExample, TaggingExample
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import (
    MIX_L2,
    OOV_TOKEN,
    PADDING_TOKEN,
    TaskModel,
    build_word_vocab,
    encode_split,
    example_sentences,
    live_inputs,
)
from elmo_core.tasks.trainer import TaskSplit

Splits = dict[str, dict[str, TaskSplit]]


def _model(task: TaskConfig, split: TaskSplit, use_elmo: bool) -> TaskModel:
    examples = list(split.dataset.examples)
    vocab = build_word_vocab(example_sentences(examples))
    cache = split.activations
    assert cache is not None
    torch.manual_seed(0)
    return TaskModel(
        task, cache.num_layers, cache.layer_dim, vocab, split.dataset.labels(), use_elmo
    )


def test_vocab_puts_padding_and_oov_first_then_frequent_words() -> None:
    vocab = build_word_vocab([["b", "a", "b"], ["c", "a", "b"], ["rare"]], min_count=2)
    assert vocab == {PADDING_TOKEN: 0, OOV_TOKEN: 1, "b": 2, "a": 3}
    assert "rare" in build_word_vocab([["rare"]], min_count=1)


def test_pairs_are_cached_premises_first() -> None:
    examples = [PairExample(["p1"], ["h1"], "x"), PairExample(["p2"], ["h2"], "y")]
    assert example_sentences(examples) == [["p1"], ["p2"], ["h1"], ["h2"]]


def test_encoded_split_batches_words_tags_and_sides() -> None:
    vocab = {PADDING_TOKEN: 0, OOV_TOKEN: 1, "a": 2, "b": 3}
    tagged = [TaggingExample(["a", "zz", "b"], ["O", "B-X", "O"]), TaggingExample(["b"], ["B-X"])]
    split = encode_split(tagged, vocab, {"O": 0, "B-X": 1})
    sides, tags = split.batch(np.array([1, 0]))
    assert sides[0].word_ids.tolist() == [[3, 0, 0], [2, 1, 3]]
    assert sides[0].mask.tolist() == [[True, False, False], [True, True, True]]
    assert tags.tolist() == [[1, 0, 0], [0, 1, 0]] and sides[0].layers is None
    pairs = [PairExample(["a"], ["b", "b"], "yes"), PairExample(["b", "a"], ["zz"], "no")]
    split = encode_split(pairs, vocab, {"no": 0, "yes": 1})
    (premise, hypothesis), labels = split.batch(np.array([1]))
    assert premise.word_ids.tolist() == [[3, 2]] and hypothesis.word_ids.tolist() == [[1]]
    assert labels.tolist() == [0]


def test_encoding_refuses_a_cache_of_other_sentences(task_splits: Splits) -> None:
    train, dev = task_splits["tagging"]["train"], task_splits["tagging"]["dev"]
    vocab = build_word_vocab(example_sentences(list(train.dataset.examples)))
    labels = {label: i for i, label in enumerate(train.dataset.labels())}
    with pytest.raises(ValueError, match="other sentences"):
        encode_split(list(train.dataset.examples), vocab, labels, dev.activations)


def test_mixes_start_uniform_and_baseline_has_none(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    split = task_splits["tagging"]["train"]
    elmo = _model(task_factory("tagging", elmo_at_output=True), split, use_elmo=True)
    assert elmo.mix_weights() == pytest.approx([1 / 3] * 3) and elmo.gamma() == 1.0
    assert elmo.mix_weights("output") == pytest.approx([1 / 3] * 3)
    baseline = _model(task_factory("tagging"), split, use_elmo=False)
    assert not baseline.has_mix("input")
    assert not any("mixes" in name for name, _ in baseline.named_parameters())
    with pytest.raises(ValueError, match="no input ELMo mix"):
        baseline.mix_weights()


def test_loss_adds_the_l2_penalty_on_mix_weights(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    split = task_splits["classification"]["train"]
    model = _model(task_factory("classification"), split, use_elmo=True).eval()
    with torch.no_grad():
        model.mixes["input"].scalar_parameters.copy_(torch.tensor([1.0, -2.0, 0.5]))
    encoded = _encode(model, split)
    sides, targets = encoded.batch(np.arange(8))
    scores = model(sides)
    head_loss = model.head.loss(scores, targets, sides[0].mask)
    penalty = model.loss(scores, targets, sides) - head_loss
    assert penalty.item() == pytest.approx(MIX_L2 * (1 + 4 + 0.25), rel=1e-5)


def _encode(model: TaskModel, split: TaskSplit):  # type: ignore[no-untyped-def]
    labels = {label: i for i, label in enumerate(model.labels)}
    activations = split.activations if model.use_elmo else None
    return encode_split(list(split.dataset.examples), model.vocab, labels, activations)


@pytest.mark.parametrize("task_type", ["tagging", "classification", "pair"])
def test_cached_and_live_activations_give_the_same_outputs(
    task_type: str,
    task_splits: Splits,
    task_factory: Callable[..., TaskConfig],
    tiny_bilm: BiLM,
) -> None:
    split = task_splits[task_type]["dev"]
    options = {"crf": True} if task_type == "tagging" else {}
    model = _model(task_factory(task_type, elmo_at_output=True, **options), split, True).eval()
    rows = np.array([3, 0, 7, 5])
    cached_sides, _ = _encode(model, split).batch(rows)
    examples = [split.dataset.examples[i] for i in rows]
    if task_type == "pair":
        token_sides = [[e.premise for e in examples], [e.hypothesis for e in examples]]
    else:
        token_sides = [[e.tokens for e in examples]]
    live_sides = [live_inputs(model, tokens, tiny_bilm) for tokens in token_sides]
    for cached, live in zip(cached_sides, live_sides, strict=True):
        assert torch.equal(cached.word_ids, live.word_ids) and torch.equal(cached.mask, live.mask)
    with torch.no_grad():
        torch.testing.assert_close(model(cached_sides), model(live_sides), atol=1e-5, rtol=1e-5)
        decoded = model.decode(model(cached_sides), cached_sides)
        assert torch.equal(decoded, model.decode(model(live_sides), live_sides))


def test_elmo_model_reads_the_layers_and_baseline_ignores_them(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    split = task_splits["classification"]["dev"]
    task = task_factory("classification")
    for use_elmo in (True, False):
        model = _model(task, split, use_elmo).eval()
        sides, _ = _encode(model, TaskSplit(split.dataset, split.activations)).batch(np.arange(4))
        layers = split.activations.batch(np.arange(4))[0]  # type: ignore[union-attr]
        first = model([sides[0]._replace(layers=layers)])
        second = model([sides[0]._replace(layers=layers + 1.0)])
        assert torch.allclose(first, second) is not use_elmo
    with pytest.raises(ValueError, match="needs the biLM layers"):
        _model(task, split, True)([sides[0]._replace(layers=None)])


def test_a_model_on_one_layer_reads_that_layer_alone(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    split = task_splits["classification"]["dev"]
    model = _model(task_factory("classification", elmo_layers=[1]), split, True).eval()
    assert model.mix_weights() == [1.0]
    sides, _ = _encode(model, split).batch(np.arange(4))
    layers = split.activations.batch(np.arange(4))[0]  # type: ignore[union-attr]
    other_layers_moved = layers.clone()
    other_layers_moved[[0, 2]] += 1.0
    with torch.no_grad():
        first = model([sides[0]._replace(layers=layers)])
        assert torch.equal(first, model([sides[0]._replace(layers=other_layers_moved)]))
        layer_one_moved = layers.clone()
        layer_one_moved[1] += 1.0
        assert not torch.allclose(first, model([sides[0]._replace(layers=layer_one_moved)]))


def test_a_layer_the_bilm_lacks_names_the_key(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    with pytest.raises(ConfigError, match="layers 0-2, not 3") as raised:
        _model(task_factory("tagging", elmo_layers=[0, 3]), task_splits["tagging"]["dev"], True)
    assert raised.value.key == "head.elmo_layers"
    with pytest.raises(ValidationError, match="distinct"):
        task_factory("tagging", elmo_layers=[1, 1])


def test_layer_norm_is_the_configs_choice(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    task = task_factory("tagging", elmo_layer_norm=True, elmo_at_output=True)
    model = _model(task, task_splits["tagging"]["dev"], True)
    assert all(mix.do_layer_norm for mix in model.mixes.values())  # type: ignore[union-attr]


def test_live_inputs_need_the_bilm_for_elmo(
    task_splits: Splits, task_factory: Callable[..., TaskConfig]
) -> None:
    model = _model(task_factory("tagging"), task_splits["tagging"]["dev"], True)
    with pytest.raises(ValueError, match="needs the biLM"):
        live_inputs(model, [["a"]], None)


def test_dataset_paths_are_not_read(task_splits: Splits) -> None:
    assert task_splits["pair"]["train"].dataset.path == Path("train")
