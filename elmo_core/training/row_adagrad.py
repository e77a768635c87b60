"""Adagrad that applies a sparse gradient as the rows it holds, without re-sorting them.

``torch.optim.Adagrad`` coalesces a sparse gradient and builds further sparse tensors from it (the
squared values, the update), work that sorts on the GPU and makes the host wait for its result,
and a single sparse gradient sends every parameter of its group down its one-tensor-at-a-time path.
The softmax's gradients arrive coalesced already (their rows are known ahead, sorted and distinct:
:class:`~elmo_core.model.softmax.SoftmaxRows`), so here each is three dense row operations, and
the dense gradients are applied together by ``torch._foreach_*`` ops. Nothing reads a value
back, and nothing changes between steps but tensors on the parameters' device (the step counts
included, where torch's Adagrad keeps them on the host and reads each back to scale its learning
rate), so a captured CUDA graph of the step replays it exactly. The state (``sum``, ``step``) is
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
        """Sparse gradients by row, dense ones together: ``sum += g²``, ``p −= lr · g /
        (√sum + eps)`` (as torch's Adagrad computes it)."""
        if closure is not None:
            raise ValueError("RowSparseAdagrad takes no closure")
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            params, grads, sums, steps = [], [], [], []
            for parameter in group["params"]:
                grad = parameter.grad
                if grad is None:
                    continue
                state = self.state[parameter]
                if state["step"].device != parameter.device:  # torch's host count, or a loaded one
                    state["step"] = state["step"].to(parameter.device)
                steps.append(state["step"])
                if grad.is_sparse:
                    self._update_rows(parameter, grad.coalesce(), state["sum"], lr, eps)
                else:
                    params.append(parameter)
                    grads.append(grad)
                    sums.append(state["sum"])
            if steps:
                torch._foreach_add_(steps, 1)
            if params:
                torch._foreach_addcmul_(sums, grads, grads, value=1)
                std = torch._foreach_add(torch._foreach_sqrt(sums), eps)
                torch._foreach_addcdiv_(params, torch._foreach_mul(grads, -lr), std)
        return None

    @staticmethod
    def _update_rows(
        parameter: nn.Parameter, grad: torch.Tensor, sum_: torch.Tensor, lr: float, eps: float
    ) -> None:
        """The update on the gradient's rows only (as torch's sparse Adagrad computes it).
        ``grad`` is coalesced: its rows are distinct."""
        ids, values = grad.indices()[0], grad.values()  # (R,), (R, ...)
        sums = sum_.index_select(0, ids).addcmul_(values, values)  # (R, ...)
        sum_.index_copy_(0, ids, sums)
        parameter.index_add_(0, ids, values / sums.sqrt().add_(eps), alpha=-lr)
