"""Task heads: padding never leaks into real rows, pooling by hand, ESIM attention masked."""

from __future__ import annotations

import pytest
import torch

from elmo_core.tasks.heads import HeadInput, SequenceEncoder, pool
from elmo_core.tasks.task_config import HeadConfig
from elmo_core.tasks.types import TASK_TYPES

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


def test_elmo_at_output_is_concatenated_to_the_encoder_output() -> None:
    torch.manual_seed(0)
    config = HeadConfig(hidden_dim=4, elmo_at_output=True, dropout=0.0)
    head = TASK_TYPES["classification"].head(INPUT_DIM, NUM_LABELS, config, output_elmo_dim=6)
    assert head.encoded_dim == 8 + 6
    side = _side([3, 2])
    elmo = torch.randn(2, 3, 6)
    first = head([side._replace(output_elmo=elmo)])
    second = head([side._replace(output_elmo=elmo + 1.0)])
    assert not torch.allclose(first, second)
