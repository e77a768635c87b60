"""train_task: ELMo and baseline both train and report; mixes learn; seeded runs repeat."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.errors import DataError
from elmo_core.model.bilm import BiLM
from elmo_core.tasks.dataset import ClassificationExample, TaggingExample, TaskDataset
from elmo_core.tasks.metrics import accuracy, span_f1
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import OOV_TOKEN, encode_split
from elmo_core.tasks.trainer import (
    BASELINE,
    ELMO,
    TaskResult,
    TaskSplit,
    build_task_model,
    epoch_batches,
    evaluate_task,
    main_metric,
    predict,
    train_task,
)
from tests.unit.elmo_core.tasks.conftest import _tagging

Splits = dict[str, dict[str, TaskSplit]]
TaskFactory = Callable[..., TaskConfig]
SPLITS = ("train", "dev", "test")


def _train(splits: dict[str, TaskSplit], task: TaskConfig, use_elmo: bool, **kw) -> TaskResult:  # type: ignore[no-untyped-def]
    return train_task(task, splits["train"], splits["dev"], splits["test"], use_elmo, **kw)


def test_tagging_elmo_and_baseline_both_train_and_report(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    task = task_factory("tagging", crf=True, elmo_at_output=True)
    seen: list[tuple[int, dict[str, float]]] = []
    elmo = _train(
        task_splits["tagging"], task, True, epoch_callback=lambda e, m: seen.append((e, m))
    )
    baseline = _train(task_splits["tagging"], task, False)
    for result in (elmo, baseline):
        assert result.metric == "f1" and 1 <= result.best_epoch <= len(result.history)
        assert {"f1", "precision", "recall", "accuracy"} <= result.dev_metrics.keys()
        splits = task_splits["tagging"]
        _, encoded = build_task_model(task, *(splits[n] for n in SPLITS), result.use_elmo)
        kept = evaluate_task(result.model, encoded["dev"], task, torch.device("cpu"))
        assert result.dev_metrics == kept  # the kept model's, though not scored again
        assert 0.0 <= result.test_metrics["f1"] <= 1.0
        assert result.history[0]["train_loss"] > result.history[-1]["train_loss"]
    assert elmo.representation == ELMO and baseline.representation == BASELINE
    assert "GloVe" in baseline.representation
    assert baseline.mix_weights is None and baseline.gamma is None
    assert [epoch for epoch, _ in seen] == [1, 2, 3]
    assert {"train_loss", "dev_f1", "mix_weight_0", "gamma", "output_gamma"} <= seen[-1][1].keys()


def test_learned_mix_weights_move_away_from_uniform(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    task = task_factory("tagging", training={"epochs": 4, "batch_size": 4, "patience": None})
    result = _train(task_splits["tagging"], task, True)
    assert result.mix_weights is not None and result.gamma is not None
    assert sum(result.mix_weights) == pytest.approx(1.0)
    assert max(abs(w - 1 / 3) for w in result.mix_weights) > 0.01
    assert result.gamma != 1.0


@pytest.mark.parametrize(
    ("task_type", "head"),
    [
        ("classification", {"pooling": "mean"}),
        ("pair", {"pair_head": "esim"}),
        ("pair", {"pair_head": "match"}),
    ],
)
def test_sentence_tasks_train_and_report_accuracy(
    task_type: str, head: dict, task_splits: Splits, task_factory: TaskFactory
) -> None:
    task = task_factory(task_type, **head, training={"epochs": 2})
    for use_elmo in (True, False):
        result = _train(task_splits[task_type], task, use_elmo)
        assert result.metric == "accuracy" and main_metric(task) == "accuracy"
        assert 0.0 <= result.dev_metrics["accuracy"] <= 1.0
        assert set(result.test_metrics) == {"accuracy"}


def test_same_seed_repeats_and_leaves_the_global_rng_alone(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    task = task_factory("classification", training={"epochs": 2})
    state = torch.random.get_rng_state()
    first = _train(task_splits["classification"], task, True, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    second = _train(task_splits["classification"], task, True, seed=7)
    other = _train(task_splits["classification"], task, True, seed=8)
    assert first.history == second.history and first.mix_weights == second.mix_weights
    assert first.history != other.history


def test_early_stopping_keeps_the_best_epoch(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    training = {"epochs": 6, "patience": 2, "lr": 1e-9, "min_updates": 0}
    task = task_factory("classification", training=training)
    result = _train(task_splits["classification"], task, False)
    assert result.best_epoch == 1 and len(result.history) == 3  # no dev gain after epoch 1


def test_a_small_set_that_scores_0_for_its_first_epochs_is_not_stopped_before_it_learns(
    task_factory: TaskFactory,
) -> None:
    """16 sentences, 4 updates an epoch: the tagger's dev F1 is 0 for its first four epochs.
    Counted from the first epoch, patience ended the run there, F1 0 (the 10 % fractions of a
    real analysis); counted once ``min_updates`` have run, it learns the task."""
    rng = random.Random(0)
    train, dev = (
        TaskSplit(TaskDataset(Path(name), [_tagging(rng) for _ in range(size)]), None)
        for name, size in (("train", 16), ("dev", 24))
    )
    scores = {}
    for min_updates in (0, 60):
        training = {"epochs": 40, "batch_size": 4, "lr": 0.001, "patience": 3}
        training |= {"batches": "random"}  # the order that showed the trap
        task = task_factory("tagging", training=training | {"min_updates": min_updates})
        result = train_task(task, train, dev, None, use_elmo=False, seed=0)
        curve = [epoch["dev_f1"] for epoch in result.history]
        scores[min_updates] = (curve, result.dev_metrics["f1"])
    stopped, learned = scores[0], scores[60]
    assert stopped[0] == [0.0, 0.0, 0.0, 0.0] and stopped[1] == 0.0  # the trap
    assert learned[0][:4] == [0.0, 0.0, 0.0, 0.0] and learned[1] > 0.9


def test_without_dev_every_epoch_runs_and_the_last_is_kept(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    splits = task_splits["classification"]
    task = task_factory("classification", training={"epochs": 2, "patience": 1})
    result = train_task(task, splits["train"], None, None, use_elmo=True)
    assert result.best_epoch == 2 and result.dev_metrics == {} and result.test_metrics == {}


def test_elmo_needs_cached_activations(task_splits: Splits, task_factory: TaskFactory) -> None:
    splits = task_splits["classification"]
    bare = TaskSplit(splits["train"].dataset)
    with pytest.raises(ValueError, match="cached activations"):
        train_task(task_factory("classification"), bare, None, None, use_elmo=True)
    result = train_task(
        task_factory("classification", training={"epochs": 1}), bare, None, None, False
    )
    assert result.best_epoch == 1


def test_predict_labels_raw_sentences_from_a_live_bilm(
    task_splits: Splits, task_factory: TaskFactory, tiny_bilm: BiLM
) -> None:
    tagger = _train(task_splits["tagging"], task_factory("tagging", crf=True), True).model
    tags = predict(tagger, [["mr", "jordan"], ["in", "jordan", "today", "unseen-word"]], tiny_bilm)
    assert [len(t) for t in tags] == [2, 4]
    assert all(tag in tagger.labels for row in tags for tag in row)
    dev = task_splits["tagging"]["dev"].dataset.examples
    cached_run = _train(task_splits["tagging"], task_factory("tagging", crf=True), True)
    live = predict(cached_run.model, [example.tokens for example in dev], tiny_bilm, batch_size=5)
    gold = [example.tags for example in dev]
    pairs = [(g, p) for gs, ps in zip(gold, live, strict=True) for g, p in zip(gs, ps, strict=True)]
    live_accuracy = sum(g == p for g, p in pairs) / len(pairs)
    assert live_accuracy == pytest.approx(cached_run.dev_metrics["accuracy"])
    pair_model = _train(
        task_splits["pair"], task_factory("pair", training={"epochs": 1}), False
    ).model
    assert predict(pair_model, [(["the"], ["the", "cat"])])[0] in ("same", "diff")
    with pytest.raises(ValueError, match="needs the biLM"):
        predict(tagger, [["mr", "jordan"]])


def test_a_dev_label_unseen_in_train_is_a_data_error(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    splits = task_splits["classification"]
    odd = TaskDataset(Path("dev.txt"), [ClassificationExample(["meh"], "neutral")])
    with pytest.raises(DataError, match="neutral"):
        train_task(task_factory("classification"), splits["train"], TaskSplit(odd), None, False)


@pytest.mark.parametrize("task_type", ["tagging", "classification", "pair"])
def test_a_subset_keeps_each_examples_own_activations(
    task_type: str, task_splits: dict[str, dict[str, TaskSplit]]
) -> None:
    split = task_splits[task_type]["dev"]
    indices = [5, 0, 3]
    subset = split.subset(indices)
    assert subset.dataset.examples == [split.dataset.examples[i] for i in indices]
    assert split.activations is not None and subset.activations is not None
    sides = 2 if task_type == "pair" else 1
    for side in range(sides):
        whole, _ = split.activations.batch([i + side * len(split.dataset) for i in indices])
        part, _ = subset.activations.batch([i + side * len(indices) for i in range(3)])
        assert torch.equal(whole, part)


def test_dev_is_scored_once_eval_every_updates_have_run_and_at_the_last_epoch(
    task_splits: Splits, task_factory: TaskFactory
) -> None:
    """64 training sentences in batches of 16: 4 updates an epoch. Scoring once 7 updates have
    run falls at the ends of epochs 2, 4, 6 and 7 (the last); patience counts those scorings."""
    splits = task_splits["tagging"]
    assert len(splits["train"].dataset.examples) == 64
    training = {"epochs": 7, "patience": None, "eval_every": 7}
    seen: list[int] = []
    result = _train(
        splits, task_factory("tagging", training=training), False,
        epoch_callback=lambda epoch, _: seen.append(epoch),
    )  # fmt: skip
    assert seen == [2, 4, 6, 7] and [h["epoch"] for h in result.history] == [2, 4, 6, 7]
    assert [h["updates"] for h in result.history] == [8, 16, 24, 28]
    assert result.best_epoch in seen
    flat = {"epochs": 12, "patience": 1, "lr": 1e-9, "min_updates": 0, "eval_every": 6}
    stopped = _train(splits, task_factory("tagging", training=flat), False)
    assert [h["epoch"] for h in stopped.history] == [2, 4] and stopped.best_epoch == 2


@pytest.mark.parametrize(
    ("task_type", "crf"),
    [("tagging", False), ("tagging", True), ("classification", False), ("pair", False)],
)
def test_evaluation_over_label_ids_scores_what_the_label_strings_score(
    task_type: str, crf: bool, task_splits: Splits, task_factory: TaskFactory
) -> None:
    """The trainer's scores (length-sorted batches, ids against the split's own label ids) are
    those of the predicted label strings of each example, in order, against its gold labels."""
    head = {"crf": crf} if task_type == "tagging" else {}
    result = _train(task_splits[task_type], task_factory(task_type, **head), False)
    examples = task_splits[task_type]["test"].dataset.examples
    if task_type == "pair":
        predicted = predict(result.model, [(e.premise, e.hypothesis) for e in examples])
    else:
        predicted = predict(result.model, [e.tokens for e in examples], batch_size=3)
    gold = [e.tags if task_type == "tagging" else e.label for e in examples]
    assert result.test_metrics["accuracy"] == pytest.approx(accuracy(gold, predicted))
    if task_type == "tagging":
        spans = span_f1(gold, predicted, "iob2")  # type: ignore[arg-type]
        assert result.test_metrics == pytest.approx(
            spans.to_metrics() | {"accuracy": accuracy(gold, predicted)}
        )


def test_bucketed_batches_hold_little_padding_and_every_example_once_an_epoch() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 60) for _ in range(200)]
    examples = [TaggingExample(["w"] * n, ["O"] * n) for n in lengths]
    split = encode_split(examples, {"w": 2, OOV_TOKEN: 1}, {"O": 0})

    def padded(batches: list[np.ndarray]) -> int:
        return sum(len(rows) * int(split.lengths()[rows].max()) for rows in batches)

    shuffler = np.random.default_rng(0)
    epochs = {
        how: [epoch_batches(split, 16, how, shuffler) for _ in range(2)]
        for how in ("bucketed", "random")
    }
    for batches in (*epochs["bucketed"], *epochs["random"]):
        assert sorted(np.concatenate(batches).tolist()) == list(range(200))
        assert max(len(rows) for rows in batches) == 16 and len(batches) == 13
    first, second = epochs["bucketed"]
    assert [rows.tolist() for rows in first] != [rows.tolist() for rows in second]
    assert padded(first) < 1.25 * sum(lengths) < padded(epochs["random"][0])
