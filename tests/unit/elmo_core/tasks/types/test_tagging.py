"""The tagging type: its loss and decoding follow the mask; entity tags are scored by span F1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.tasks.heads import HeadInput
from elmo_core.tasks.task_config import HeadConfig, TaskConfig
from elmo_core.tasks.types.tagging import Tagging, TaggingHead


def _task(form: str, scheme: str = "iob2") -> TaskConfig:
    return TaskConfig(
        name="t",
        type="tagging",
        format=form,
        train=Path("x"),
        reader={"tag_scheme": scheme},  # type: ignore[arg-type]
    )


def test_loss_and_decode_follow_the_mask() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    side = HeadInput(torch.randn(2, 3, 5) * mask.unsqueeze(-1), mask)
    for crf in (False, True):
        head = TaggingHead(5, 3, HeadConfig(hidden_dim=4, crf=crf))
        scores = head([side])
        targets = torch.tensor([[0, 1, 2], [2, 0, 0]])
        noisy_targets = torch.where(side.mask, targets, torch.ones_like(targets))
        loss = head.loss(scores, targets, side.mask)
        assert loss.item() == pytest.approx(head.loss(scores, noisy_targets, side.mask).item())
        decoded = head.decode(scores, side.mask)
        assert decoded.shape == (2, 3) and decoded[~side.mask].eq(0).all()
        loss.backward()
        assert all(p.grad is not None for p in head.parameters())


def test_entity_tags_are_scored_by_span_f1_and_parts_of_speech_by_accuracy() -> None:
    labels = ["B-PER", "I-PER", "O"]
    gold = np.array([0, 1, 2, 0], dtype=np.int64)  # "Anna Smith left Bob": two PER spans
    predicted = np.array([0, 2, 2, 0], dtype=np.int64)  # the first cut short
    offsets = np.array([0, 4], dtype=np.int64)
    entities = Tagging().scores(_task("conll2003"), labels, gold, predicted, offsets)
    assert Tagging().main_metric(_task("conll2003")) == "f1"
    assert entities["f1"] == pytest.approx(0.5) and entities["accuracy"] == 0.75
    untyped = _task("conll2003", scheme="none")
    assert Tagging().main_metric(untyped) == "accuracy"
    assert Tagging().scores(untyped, labels, gold, predicted, offsets) == {"accuracy": 0.75}


def test_error_tables_give_each_entity_type_and_the_whole() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    predicted = [["B-PER", "O", "O", "B-LOC"]]
    tables = Tagging().error_tables(
        _task("conll2003"), ["B-LOC", "B-PER", "I-PER", "O"], gold, predicted
    )
    assert tables.confusion is None and tables.per_type is not None
    assert tables.per_type["type"] == ["LOC", "PER", "(all)"]
    assert tables.per_type["f1"] == [1.0, 0.0, 0.5]
