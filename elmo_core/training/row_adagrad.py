"""Adagrad that applies a sparse gradient as the rows it holds, without re-sorting them.

``torch.optim.Adagrad`` coalesces a sparse gradient again (a sort the host waits for) and keeps
its step counts on the host. The softmax's rows arrive sorted and distinct (past the exchange's
padding: zero rows repeating the last id, which add nothing), so here they are read and written by
row and nothing is read back: a captured CUDA graph of the step replays it. The
state is torch's, so a checkpoint of one loads into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from torch import nn


class RowSparseAdagrad(torch.optim.Adagrad):
    """``torch.optim.Adagrad`` (no weight or lr decay) with sparse gradients applied by row."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float,
        initial_accumulator_value: float,
        eps: float = 1e-10,
    ) -> None:
        super().__init__(
            params, lr=lr, initial_accumulator_value=initial_accumulator_value, eps=eps
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """``sum += g²``, ``p −= lr · g / (√sum + eps)`` (as torch's Adagrad computes it, dense and
        sparse), on the sparse gradients' rows only; the elementwise work of every gradient, dense
        ones and sparse ones' rows, in one multi-tensor op each."""
        if closure is not None:
            raise ValueError("RowSparseAdagrad takes no closure")
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            params, grads, sums, steps, rows = [], [], [], [], []
            for parameter in group["params"]:
                grad = parameter.grad
                if grad is None:
                    continue
                state = self.state[parameter]
                if state["step"].device != parameter.device:  # torch's host count, or a loaded one
                    state["step"] = state["step"].to(parameter.device)
                steps.append(state["step"])
                if grad.is_sparse:
                    rows.append(_Rows(parameter, grad.coalesce(), state["sum"]))
                else:
                    params.append(parameter)
                    grads.append(grad)
                    sums.append(state["sum"])
            if not steps:
                continue
            torch._foreach_add_(steps, 1)
            if params:
                torch._foreach_addcmul_(sums, grads, grads)
            row_values = [row.values for row in rows]
            if rows:  # added by row: a row named again with zeros (exchange padding) adds nothing
                squares = torch._foreach_mul(row_values, row_values)
                for row, square in zip(rows, squares, strict=True):
                    row.sum.index_add_(0, row.ids, square)
            row_sums = [row.sum.index_select(0, row.ids) for row in rows]  # their accumulators
            std = torch._foreach_sqrt(sums + row_sums)
            torch._foreach_add_(std, eps)
            if params:
                torch._foreach_addcdiv_(params, grads, std[: len(params)], value=-lr)
            if rows:
                updates = torch._foreach_div(row_values, std[len(params) :])
                for row, update in zip(rows, updates, strict=True):
                    row.parameter.index_add_(0, row.ids, update, alpha=-lr)
        return None


class _Rows(NamedTuple):
    """A sparse gradient's rows, its parameter's and its accumulator's (``grad`` coalesced: its
    rows are distinct, but for zero rows the exchange pads with)."""

    parameter: nn.Parameter
    grad: torch.Tensor
    sum: torch.Tensor

    @property
    def ids(self) -> torch.Tensor:
        return self.grad.indices()[0]  # (R,)

    @property
    def values(self) -> torch.Tensor:
        return self.grad.values()  # (R, ...)
