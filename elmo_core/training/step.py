"""The one biLM training step: what a Ray Train worker runs and the GPU benchmark times.

Kept in one place and free of Ray, so the benchmark measures exactly what users get. The backward
takes ``loss × unroll_steps``, as bilm-tf does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from elmo_core.config import TrainConfig
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM, BiLMState, LossOutput
from elmo_core.model.char_cnn import TokenTypes
from elmo_core.model.sampler import SampledCandidates
from elmo_core.training.gradient_exchange import (
    SOFTMAX_PARAMETERS,
    ExchangeMode,
    broadcast_parameters,
    clip_global_norm,
    exchange_softmax_gradients,
    exclude_from_ddp,
    softmax_rows_bound,
)
from elmo_core.training.row_adagrad import RowSparseAdagrad
from elmo_core.training.step_graphs import StepGraphs, shape_key


class LossModule(nn.Module):
    """``BiLM.training_loss`` as ``forward``, so a DDP wrapper's hooks see every call."""

    def __init__(self, bilm: BiLM) -> None:
        super().__init__()
        self.bilm = bilm

    def forward(self, *args: Any, **kwargs: Any) -> tuple[LossOutput, BiLMState]:
        """``BiLM.training_loss``'s arguments, passed through."""
        return self.bilm.training_loss(*args, **kwargs)


class StepResult(NamedTuple):
    """A step's results (a named tuple: a captured step's outputs are copied out leaf by leaf)."""

    output: LossOutput
    state: BiLMState  # detached: the next window starts from it (truncated BPTT)
    grad_norm: torch.Tensor  # 0-dim, before clipping; reading it waits for the step
    softmax_bytes: int = 0  # the softmax rows this worker sent (the dense weights go by DDP)


class TrainingStep:
    """One optimiser step on one window of each stream, as ``train`` and ``grad_exchange`` say.

    Build it with :meth:`build`; a data-parallel caller passes its model wrapper (DDP), which then
    skips the softmax: its touched rows are exchanged apart, after the backward pass. With
    ``train.capture_step`` each step shape is captured as one CUDA graph and replayed
    (:class:`~elmo_core.training.step_graphs.StepGraphs`).
    """

    def __init__(
        self,
        module: nn.Module,
        bilm: BiLM,
        optimizer: torch.optim.Optimizer,
        train: TrainConfig,
        grad_exchange: ExchangeMode,
    ) -> None:
        self.module, self.bilm, self.optimizer = module, bilm, optimizer
        self.train, self.grad_exchange = train, grad_exchange
        self.graphs: StepGraphs | None = None
        if train.capture_step:
            self.graphs = _step_graphs(bilm, optimizer)

    @classmethod
    def build(
        cls,
        bilm: BiLM,
        train: TrainConfig,
        grad_exchange: ExchangeMode = "sparse",
        wrap_model: Callable[[nn.Module], nn.Module] = lambda module: module,
    ) -> TrainingStep:
        """The step over ``bilm`` (already on its device): softmax rows apart, Adagrad."""
        if bilm.softmax is None:
            raise ConfigError("a BiLM built without vocab_size has no softmax", key="vocab_size")
        bilm.softmax.sparse = grad_exchange == "sparse"
        bilm.zero_grad(set_to_none=True)  # a step's softmax rows are its own: marked distinct
        module = LossModule(bilm)
        exclude_from_ddp(module, [f"bilm.{name}" for name in SOFTMAX_PARAMETERS])
        broadcast_parameters(bilm.softmax.parameters())  # what DDP does for the others
        optimizer = RowSparseAdagrad(
            bilm.parameters(), lr=train.lr, initial_accumulator_value=train.initial_accumulator
        )  # its accumulators stay float32 whatever autocast does
        return cls(wrap_model(module), bilm, optimizer, train, grad_exchange)

    def __call__(
        self,
        forward_inputs: torch.Tensor,
        forward_targets: torch.Tensor,
        backward_inputs: torch.Tensor,
        backward_targets: torch.Tensor,
        state: BiLMState | None,
        candidates: tuple[SampledCandidates, SampledCandidates] | None = None,
        types: TokenTypes | None = None,
        softmax_rows: torch.Tensor | None = None,
    ) -> StepResult:
        """The step; ``candidates`` (forward, backward), both windows' token ``types`` and the
        ``softmax_rows`` they touch found ahead by the data loader, else the model finds them (on
        the device, where finding types or rows makes the host wait)."""
        arguments: dict[str, Any] = {
            "forward_inputs": forward_inputs,
            "forward_targets": forward_targets,
            "backward_inputs": backward_inputs,
            "backward_targets": backward_targets,
            "state": state,
            "candidates": candidates,
            "types": types,
            "softmax_rows": softmax_rows,
        }
        if self.graphs is None:
            return self._step(arguments)
        learning_rates = tuple(group["lr"] for group in self.optimizer.param_groups)
        return self.graphs(self._step, arguments, shape_key(arguments, learning_rates))

    def _step(self, arguments: dict[str, Any]) -> StepResult:
        """The step on :meth:`__call__`'s ``arguments``, by name: what a graph captures."""
        device = arguments["forward_targets"].device
        autocast = (  # none on the meta device, which stands in for CUDA in the rehearsal
            torch.autocast("cuda", dtype=torch.bfloat16)
            if device.type == "cuda" and self.train.bf16
            else contextlib.nullcontext()
        )
        with autocast:
            output, new_state = self.module(**arguments)
        (output.loss * self.train.unroll_steps).backward()  # bilm-tf scales by the unroll
        softmax = self.bilm.softmax
        assert softmax is not None
        if arguments["softmax_rows"] is not None:  # gathered once for both directions
            softmax.mark_rows_distinct()
        bound = softmax_rows_bound(
            softmax.num_classes, self.train.batch_size, self.train.unroll_steps, softmax.num_samples
        )
        sent = exchange_softmax_gradients(softmax.weight, softmax.bias, self.grad_exchange, bound)
        grad_norm = clip_global_norm(self.bilm.parameters(), self.train.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        detached = (new_state[0].detach(), new_state[1].detach())
        return StepResult(output, detached, grad_norm, sent)


def _step_graphs(bilm: BiLM, optimizer: torch.optim.Optimizer) -> StepGraphs:
    """Graphs for a step on CUDA with one worker: its exchange over gloo runs on the host, and a
    graph holds the optimiser's state tensors, so a load of that state forgets them."""
    device = next(bilm.parameters()).device
    if device.type != "cuda":
        raise ConfigError(
            f"replays CUDA graphs; this model is on {device}", key="train.capture_step"
        )
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        raise ConfigError(
            "captures one worker's step: set run.num_workers=1", key="train.capture_step"
        )
    graphs = StepGraphs(forget_partial=lambda: optimizer.zero_grad(set_to_none=True))
    optimizer.register_load_state_dict_post_hook(lambda _: graphs.clear())
    return graphs
