"""Task heads: padding never leaks into real rows, pooling by hand, ESIM attention masked."""

from __future__ import annotations

import pytest
import torch

from elmo_core.tasks.heads import (
    ClassificationHead,
    HeadInput,
    PairHead,
    SequenceEncoder,
    TaggingHead,
    _masked_softmax,
    build_head,
    pool,
)
from elmo_core.tasks.task_config import HeadConfig

INPUT_DIM = 5
NUM_LABELS = 3


def _side(lengths: list[int], width: int | None = None, seed: int = 0) -> HeadInput:
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    inputs = torch.randn(len(lengths), width, INPUT_DIM, generator=generator)
    mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(1)
    return HeadInput(inputs * mask.unsqueeze(-1), mask)


def _repadded(side: HeadInput, width: int) -> HeadInput:
    """The same rows with more padding (garbage in the padded inputs)."""
    extra = width - side.inputs.shape[1]
    inputs = torch.cat([side.inputs, torch.full((len(side.inputs), extra, INPUT_DIM), 9.0)], 1)
    mask = torch.cat([side.mask, torch.zeros(len(side.mask), extra, dtype=torch.bool)], 1)
    return HeadInput(inputs, mask)


def test_pool_by_hand() -> None:
    values = torch.tensor([[[1.0, -4.0], [3.0, 2.0], [100.0, 100.0]]])
    mask = torch.tensor([[True, True, False]])
    assert pool(values, mask, "max").tolist() == [[3.0, 2.0]]
    assert pool(values, mask, "mean").tolist() == [[2.0, -1.0]]
    empty = torch.zeros(1, 3, dtype=torch.bool)
    assert pool(values, empty, "max").tolist() == [[0.0, 0.0]]


def test_encoder_output_ignores_padding_and_is_zero_there() -> None:
    torch.manual_seed(0)
    encoder = SequenceEncoder(INPUT_DIM, 4, num_layers=2, dropout=0.0)
    side = _side([3, 1])
    alone = encoder(side.inputs[:1, :3], side.mask[:1, :3])
    padded = encoder(*_repadded(side, 6)[:2])
    torch.testing.assert_close(padded[:1, :3], alone)
    assert padded.shape == (2, 6, 8) and padded[~_repadded(side, 6).mask].abs().sum() == 0


@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_cpu_path_gives_the_packed_outputs_and_gradients(num_layers: int) -> None:
    torch.manual_seed(0)
    encoder = SequenceEncoder(INPUT_DIM, 4, num_layers=num_layers, dropout=0.0)
    side = _repadded(_side([4, 1, 0, 6, 3]), 8)  # an empty row, and garbage in the padding
    inputs = side.inputs.requires_grad_()
    weights = torch.randn(5, 8, 8)  # a loss that weighs every output differently
    grads = {}
    for path in (encoder.packed, encoder.padded):
        outputs = path(inputs, side.mask) * side.mask.unsqueeze(-1)
        grads[path.__name__] = torch.autograd.grad(
            (outputs * weights).sum(), [inputs, *encoder.parameters()]
        )
        grads[path.__name__] += (outputs,)
    for packed, padded in zip(grads["packed"], grads["padded"], strict=True):
        torch.testing.assert_close(padded, packed)


@pytest.mark.parametrize(
    ("head_class", "options"),
    [
        (TaggingHead, {}),
        (TaggingHead, {"crf": True}),
        (ClassificationHead, {"pooling": "max"}),
        (ClassificationHead, {"pooling": "mean"}),
        (PairHead, {"pair_head": "esim"}),
        (PairHead, {"pair_head": "match"}),
    ],
)
def test_scores_do_not_depend_on_padding(head_class: type, options: dict) -> None:
    torch.manual_seed(0)
    head = head_class(INPUT_DIM, NUM_LABELS, HeadConfig(hidden_dim=4, **options)).eval()
    num_sides = 2 if head_class is PairHead else 1
    sides = [_side([4, 2, 3], seed=s) for s in range(num_sides)]
    scores = head(sides)
    repadded = head([_repadded(side, 7) for side in sides])
    if head_class is TaggingHead:
        assert scores.shape == (3, 4, NUM_LABELS)
        torch.testing.assert_close(repadded[:, :4], scores)
    else:
        assert scores.shape == (3, NUM_LABELS)
        torch.testing.assert_close(repadded, scores)


def test_tagging_loss_and_decode_follow_the_mask() -> None:
    torch.manual_seed(0)
    for crf in (False, True):
        head = TaggingHead(INPUT_DIM, NUM_LABELS, HeadConfig(hidden_dim=4, crf=crf))
        side = _side([3, 1])
        scores = head([side])
        targets = torch.tensor([[0, 1, 2], [2, 0, 0]])
        noisy_targets = torch.where(side.mask, targets, torch.ones_like(targets))
        loss = head.loss(scores, targets, side.mask)
        assert loss.item() == pytest.approx(head.loss(scores, noisy_targets, side.mask).item())
        decoded = head.decode(scores, side.mask)
        assert decoded.shape == (2, 3) and decoded[~side.mask].eq(0).all()
        loss.backward()
        assert all(p.grad is not None for p in head.parameters())


def test_elmo_at_output_is_concatenated_to_the_encoder_output() -> None:
    torch.manual_seed(0)
    config = HeadConfig(hidden_dim=4, elmo_at_output=True, dropout=0.0)
    head = build_head("classification", INPUT_DIM, NUM_LABELS, config, output_elmo_dim=6)
    assert head.encoded_dim == 8 + 6
    side = _side([3, 2])
    elmo = torch.randn(2, 3, 6)
    first = head([side._replace(output_elmo=elmo)])
    second = head([side._replace(output_elmo=elmo + 1.0)])
    assert not torch.allclose(first, second)


def test_esim_alignment_attends_only_to_real_tokens() -> None:
    scores = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]]).unsqueeze(1)
    weights = _masked_softmax(scores, mask)
    assert weights[0, :, 2:].abs().sum() == 0
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    assert _masked_softmax(scores, torch.zeros_like(mask)).abs().sum() == 0


def test_build_head_picks_the_task_type() -> None:
    config = HeadConfig(hidden_dim=4)
    assert isinstance(build_head("tagging", INPUT_DIM, 2, config, 0), TaggingHead)
    assert isinstance(build_head("classification", INPUT_DIM, 2, config, 0), ClassificationHead)
    assert isinstance(build_head("pair", INPUT_DIM, 2, config, 0), PairHead)
