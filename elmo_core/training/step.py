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
    SPARSE_MODES,
    ExchangeMode,
    RowsInFlight,
    agree_on_rows,
    broadcast_parameters,
    clip_global_norm,
    exchange_softmax_gradients,
    exclude_from_ddp,
    launch_softmax_exchange,
    softmax_rows_bound,
)
from elmo_core.training.row_adagrad import RowSparseAdagrad
from elmo_core.training.step_graphs import StepGraphs, shape_key

EXCHANGE_LAUNCHED = "softmax_rows_exchange_launched"  # the profiler's label of the launch


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
    softmax_bytes: int = 0  # the softmax rows' bytes this worker sent, and received (a ring's)


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
        overlap_exchange: bool = True,
    ) -> None:
        self.module, self.bilm, self.optimizer = module, bilm, optimizer
        self.train, self.grad_exchange = train, grad_exchange
        self.agreeing = grad_exchange == "union" and _world_size() > 1
        # the union's rows are agreed on the host: NCCL's group cannot, a gloo one can
        self.host_group = None
        if self.agreeing and torch.distributed.get_backend() != "gloo":
            self.host_group = torch.distributed.new_group(backend="gloo")
        # the union exchange, launched from the softmax's gradients as the backward makes them
        self.overlapping = self.agreeing and overlap_exchange
        self._union: torch.Tensor | None = None  # this step's agreed rows, while it runs
        self._in_flight: RowsInFlight | None = None
        self._rows_distinct = False  # the step's rows were gathered once (found ahead)
        if self.overlapping:
            assert bilm.softmax is not None
            for parameter in (bilm.softmax.weight, bilm.softmax.bias):
                parameter.register_post_accumulate_grad_hook(self._softmax_grad)
        self.graphs: StepGraphs | None = None
        if train.capture_step:
            self.graphs = _step_graphs(bilm, optimizer)

    @classmethod
    def build(
        cls,
        bilm: BiLM,
        train: TrainConfig,
        grad_exchange: ExchangeMode = "union",
        wrap_model: Callable[[nn.Module], nn.Module] = lambda module: module,
        overlap_exchange: bool = True,
    ) -> TrainingStep:
        """The step over ``bilm`` (already on its device): softmax rows apart, Adagrad.
        ``overlap_exchange=False`` exchanges the union's rows after the backward, not during it:
        the baseline ``benchmarks/bench_exchange.py`` times the overlap against."""
        if bilm.softmax is None:
            raise ConfigError("a BiLM built without vocab_size has no softmax", key="vocab_size")
        bilm.softmax.sparse = grad_exchange in SPARSE_MODES
        bilm.zero_grad(set_to_none=True)  # a step's softmax rows are its own: marked distinct
        module = LossModule(bilm)
        exclude_from_ddp(module, [f"bilm.{name}" for name in SOFTMAX_PARAMETERS])
        broadcast_parameters(bilm.softmax.parameters())  # what DDP does for the others
        optimizer = RowSparseAdagrad(
            bilm.parameters(), lr=train.lr, initial_accumulator_value=train.initial_accumulator
        )  # its accumulators stay float32 whatever autocast does
        return cls(wrap_model(module), bilm, optimizer, train, grad_exchange, overlap_exchange)

    def agree_on_rows(self, softmax_rows: torch.Tensor | None) -> torch.Tensor | None:
        """The softmax rows any worker touches in the coming step, agreed from this worker's
        ``softmax_rows`` on the host (found ahead by its loader): what ``row_union`` takes. None
        where no worker needs it: one worker, or an exchange other than ``union``. Every worker
        calls it once a step, before the step."""
        if not self.agreeing:
            return None
        if softmax_rows is None:
            raise ValueError(
                "run.grad_exchange=union needs each step's softmax rows found ahead by the loader"
            )
        assert self.bilm.softmax is not None
        return agree_on_rows(softmax_rows, self.bilm.softmax.num_classes, self.host_group)

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
        row_union: torch.Tensor | None = None,
    ) -> StepResult:
        """The step; ``candidates`` (forward, backward), both windows' token ``types`` and the
        ``softmax_rows`` they touch found ahead by the data loader, else the model finds them (on
        the device, where finding types or rows makes the host wait); ``row_union``, on the host,
        what :meth:`agree_on_rows` returned for this step."""
        device = forward_targets.device
        if row_union is not None and device.type == "cuda":  # from pinned memory: no wait
            row_union = row_union.pin_memory().to(device, non_blocking=True)
        arguments: dict[str, Any] = {
            "forward_inputs": forward_inputs,
            "forward_targets": forward_targets,
            "backward_inputs": backward_inputs,
            "backward_targets": backward_targets,
            "state": state,
            "candidates": candidates,
            "types": types,
            "softmax_rows": softmax_rows,
            "row_union": row_union,
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
            output, new_state = self.module(
                **{name: value for name, value in arguments.items() if name != "row_union"}
            )
        if self.overlapping:  # armed for _softmax_grad (nothing left from a step that failed)
            self._union, self._in_flight = arguments["row_union"], None
            self._rows_distinct = arguments["softmax_rows"] is not None
        (output.loss * self.train.unroll_steps).backward()  # bilm-tf scales by the unroll
        softmax = self.bilm.softmax
        assert softmax is not None
        if arguments["softmax_rows"] is not None:  # gathered once for both directions
            softmax.mark_rows_distinct()
        in_flight, self._in_flight, self._union = self._in_flight, None, None
        bound = softmax_rows_bound(
            softmax.num_classes, self.train.batch_size, self.train.unroll_steps, softmax.num_samples
        )
        sent = exchange_softmax_gradients(
            softmax.weight,
            softmax.bias,
            self.grad_exchange,
            bound,
            arguments["row_union"],
            in_flight,
        )
        grad_norm = clip_global_norm(self.bilm.parameters(), self.train.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        detached = (new_state[0].detach(), new_state[1].detach())
        return StepResult(output, detached, grad_norm, sent)

    def _softmax_grad(self, _: torch.Tensor) -> None:
        """Autograd's hook as one of the softmax's gradients is stored: once both are (the step
        began with none), this step's union exchange is launched, before the LSTMs' backward."""
        softmax = self.bilm.softmax
        assert softmax is not None
        if self._union is None or softmax.weight.grad is None or softmax.bias.grad is None:
            return
        if self._rows_distinct:  # gathered once for both directions
            softmax.mark_rows_distinct()
        with torch.profiler.record_function(EXCHANGE_LAUNCHED):
            self._in_flight = launch_softmax_exchange(softmax.weight, softmax.bias, self._union)
        self._union = None


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


def _world_size() -> int:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if distributed else 1
