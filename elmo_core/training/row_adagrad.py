"""Adagrad that applies a sparse gradient as the rows it holds, without re-sorting them.

``torch.optim.Adagrad`` coalesces a sparse gradient and builds further sparse tensors from it (the
squared values, the update), work that sorts on the GPU and makes the host wait for its result,
and a single sparse gradient sends every parameter of its group down its one-tensor-at-a-time path.
The softmax's gradients arrive coalesced already (their rows are known ahead, sorted and distinct:
:class:`~elmo_core.model.softmax.SoftmaxRows`), so here each is three dense row operations, and
the dense gradients go through torch's own Adagrad together. The state (``sum``, ``step``) is
torch's, so a checkpoint of one loads into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
        """Sparse gradients by row here, then the dense ones by torch's Adagrad."""
        if closure is not None:
            raise ValueError("RowSparseAdagrad takes no closure")
        held = []
        for group in self.param_groups:
            for parameter in group["params"]:
                grad = parameter.grad
                if grad is not None and grad.is_sparse:
                    self._update_rows(parameter, grad.coalesce(), group["lr"], group["eps"])
                    held.append((parameter, grad))
                    parameter.grad = None  # torch's step skips it
        try:
            super().step()
        finally:
            for parameter, grad in held:
                parameter.grad = grad
        return None

    def _update_rows(
        self, parameter: nn.Parameter, grad: torch.Tensor, lr: float, eps: float
    ) -> None:
        """``sum += g²``, ``p −= lr · g / (√sum + eps)`` on the gradient's rows only (as torch's
        sparse Adagrad computes it). ``grad`` is coalesced: its rows are distinct."""
        state = self.state[parameter]
        state["step"] += 1
        ids, values = grad.indices()[0], grad.values()  # (R,), (R, ...)
        sums = state["sum"].index_select(0, ids).addcmul_(values, values)  # (R, ...)
        state["sum"].index_copy_(0, ids, sums)
        parameter.index_add_(0, ids, values / sums.sqrt().add_(eps), alpha=-lr)
