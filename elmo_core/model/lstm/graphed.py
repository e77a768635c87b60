"""The graphed variant: the fused ops under ``torch.compile``, their kernels captured and replayed
as CUDA graphs while training.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import torch

import elmo_core.model.lstm.fused as fused
from elmo_core.model.lstm.reference import LayerLoop

_WHOLE_STEP_CAPTURED = contextvars.ContextVar("whole_step_captured", default=False)


@contextlib.contextmanager
def whole_step_captured() -> Iterator[None]:
    """Within it, the layers run their fused ops uncaptured: the step around them is captured
    whole (:mod:`elmo_core.training.step_graphs`), and a CUDA graph cannot nest in another."""
    token = _WHOLE_STEP_CAPTURED.set(True)
    try:
        yield
    finally:
        _WHOLE_STEP_CAPTURED.reset(token)


@functools.cache
def graphed_layer() -> LayerLoop:
    """:func:`~elmo_core.model.lstm.fused.fused_layer` under ``torch.compile``'s
    ``reduce-overhead`` mode, made on first use (``torch.compile`` imports Dynamo, about a
    second). Both ops keep whole by their fake
    implementations, so each layer's forward and backward are captured as CUDA graphs of the ops'
    own kernels, and replayed."""
    return torch.compile(fused.fused_layer, fullgraph=True, dynamic=False, mode="reduce-overhead")


class GraphedProjectedLSTM(fused.FusedProjectedLSTM):
    """:class:`FusedProjectedLSTM` replayed as CUDA graphs while training: a step's host launches
    a few graphs instead of each op's kernels one by one (at 128 rows the GPU waits for the host
    more than half a step: benchmarks/results/gpu_bf16_backward-2026-11-27.md). The graphs' inputs
    are copied into their static buffers at each replay, and their outputs live until the next
    step begins (the caller copies the state it carries: ``run_stack`` stacks it). Without CUDA,
    the compiled ops run as they are."""

    def layer_loop(self) -> LayerLoop:
        """The ops uncaptured when grad is off (inference, validation): with no backward pending,
        each call would start a new cudagraph-trees generation and overwrite the previous call's
        outputs while ``run_stack`` still reads them (the residual add). Uncaptured too inside
        :func:`whole_step_captured`."""
        if not torch.is_grad_enabled() or _WHOLE_STEP_CAPTURED.get():
            return fused.fused_layer
        return graphed_layer()
