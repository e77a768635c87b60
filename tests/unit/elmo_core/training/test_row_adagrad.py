"""RowSparseAdagrad is torch's Adagrad, with sparse rows applied without re-sorting them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.training.row_adagrad import RowSparseAdagrad


def _rows(ids: list[int], values: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.sparse_coo_tensor(
        torch.tensor([ids]), values, shape, is_coalesced=True, check_invariants=True
    )


def _parameters(seed: int) -> list[nn.Parameter]:
    torch.manual_seed(seed)
    return [
        nn.Parameter(torch.randn(10, 3)),
        nn.Parameter(torch.randn(10)),
        nn.Parameter(torch.randn(4, 4)),
    ]


def test_three_steps_equal_torch_adagrad_on_sparse_and_dense_gradients() -> None:
    ours, reference = _parameters(0), _parameters(0)
    ours_optimizer = RowSparseAdagrad(ours, lr=0.2, initial_accumulator_value=1.0)
    reference_optimizer = torch.optim.Adagrad(reference, lr=0.2, initial_accumulator_value=1.0)
    generator = torch.Generator().manual_seed(1)
    for ids in ([1, 4, 7], [0, 4, 9], [4]):  # row 4 each step: its sum accumulates
        weight_rows = torch.randn(len(ids), 3, generator=generator)
        bias_rows = torch.randn(len(ids), generator=generator)
        dense = torch.randn(4, 4, generator=generator)
        for parameters, optimizer in ((ours, ours_optimizer), (reference, reference_optimizer)):
            parameters[0].grad = _rows(ids, weight_rows, (10, 3))
            parameters[1].grad = _rows(ids, bias_rows, (10,))
            parameters[2].grad = dense.clone()
            with torch.sparse.check_sparse_tensor_invariants(enable=True):  # torch's makes some
                optimizer.step()
        assert ours[0].grad is not None and ours[0].grad.is_sparse  # gradients are left as given
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    untouched = [2, 3, 5, 6, 8]
    torch.testing.assert_close(ours[0][untouched], _parameters(0)[0][untouched], rtol=0, atol=0)


def test_zero_rows_repeating_the_last_id_as_the_exchange_pads_change_nothing() -> None:
    plain, padded = _parameters(0), _parameters(0)
    values = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    with_padding = torch.cat([values, torch.zeros(3, 3)])
    for parameters, ids, rows in ((plain, [2, 9], values), (padded, [2, 9, 9, 9, 9], with_padding)):
        parameters[0].grad = torch.sparse_coo_tensor(
            torch.tensor([ids]), rows, (10, 3), is_coalesced=True, check_invariants=False
        )
        RowSparseAdagrad(parameters[:1], lr=0.2, initial_accumulator_value=1.0).step()
    torch.testing.assert_close(padded[0], plain[0], rtol=0, atol=0)


def test_its_state_is_torch_adagrads_so_checkpoints_load_either_way() -> None:
    ours = _parameters(0)
    optimizer = RowSparseAdagrad(ours, lr=0.2, initial_accumulator_value=1.0)
    ours[0].grad = _rows([3], torch.ones(1, 3), (10, 3))
    optimizer.step()
    reference = torch.optim.Adagrad(_parameters(0), lr=0.2, initial_accumulator_value=1.0)
    reference.load_state_dict(optimizer.state_dict())
    assert float(reference.state_dict()["state"][0]["step"]) == 1.0
    torch.testing.assert_close(reference.state_dict()["state"][0]["sum"][3], torch.full((3,), 2.0))


class _Reads(TorchDispatchMode):
    """Counts the ops that read a tensor's value into Python (a step count included)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:  # noqa: ANN001
        self.reads += func._schema.name == "aten::_local_scalar_dense"
        return func(*args, **(kwargs or {}))


def test_a_step_reads_nothing_back_and_counts_on_the_parameters_device() -> None:
    """Torch's Adagrad counts steps on the host and reads each count back: a CUDA graph of the
    step would replay neither. Here the counts are tensors beside the parameters."""
    ours = _parameters(0)
    optimizer = RowSparseAdagrad(ours, lr=0.2, initial_accumulator_value=1.0)
    for _ in range(2):
        ours[0].grad = _rows([3], torch.ones(1, 3), (10, 3))
        ours[2].grad = torch.ones(4, 4)
        with _Reads() as mode:
            optimizer.step()
        assert mode.reads == 0
    assert float(optimizer.state[ours[0]]["step"]) == 2.0
    meta = [nn.Parameter(torch.zeros(4, 4, device="meta"))]
    on_meta = RowSparseAdagrad(meta, lr=0.2, initial_accumulator_value=1.0)
    meta[0].grad = torch.ones(4, 4, device="meta")
    on_meta.step()
    assert on_meta.state[meta[0]]["step"].device.type == "meta"
