"""The pair type: ESIM attends to real tokens only; its params name the options its head reads."""

from __future__ import annotations

from pathlib import Path

import torch

from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.types.pair import Pair, _masked_softmax


def test_esim_alignment_attends_only_to_real_tokens() -> None:
    scores = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]]).unsqueeze(1)
    weights = _masked_softmax(scores, mask)
    assert weights[0, :, 2:].abs().sum() == 0
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    assert _masked_softmax(scores, torch.zeros_like(mask)).abs().sum() == 0


def test_only_the_matching_head_reads_pooling() -> None:
    def task(head: str) -> TaskConfig:
        return TaskConfig(
            name="p", type="pair", format="snli", train=Path("x"), head={"pair_head": head}
        )  # type: ignore[arg-type]

    assert Pair().options_read(task("esim")) == ("pair_head",)
    assert Pair().options_read(task("match")) == ("pair_head", "pooling")
