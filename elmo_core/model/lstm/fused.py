"""The fused variants: each layer's step loop as one op, the training op or the inference op;
``graphed`` replays the training ops as CUDA graphs.

The inference op runs where no gradient can reach the layer's inputs, state or weights, and keeps
nothing for a backward. Custom ops run below autocast, so here the weights are cast as it would.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from elmo_core.model.lstm.fused_inference import lstm_layer_inference
from elmo_core.model.lstm.fused_steps import Tensors3
from elmo_core.model.lstm.fused_training import lstm_layer
from elmo_core.model.lstm.reference import LayerLoop, LayerWeights, ProjectedLSTM


def fused_layer(
    inputs: Tensor,
    mask: Tensor,
    h: Tensor,
    c: Tensor,
    weights: LayerWeights,
    cell_clip: float | None,
    proj_clip: float | None,
) -> Tensors3:
    """:func:`~elmo_core.model.lstm.reference.run_layer` as one op: the same arguments and
    results; the inference op where no gradient can reach the inputs, state or weights."""
    weights = weights.for_autocast()
    arguments = (inputs, mask, h, c, *weights, cell_clip, proj_clip)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (inputs, h, c, *weights)):
        outputs, h, c, *_ = lstm_layer(*arguments)
        return outputs, h, c
    return lstm_layer_inference(*arguments)


class FusedProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer's masked step loop run as one op."""

    def layer_loop(self) -> LayerLoop:
        return fused_layer


@functools.cache
def graphed_layer() -> LayerLoop:
    """:func:`fused_layer` under ``torch.compile``'s ``reduce-overhead`` mode, made on first use
    (``torch.compile`` imports Dynamo, about a second). Both ops keep whole by their fake
    implementations, so each layer's forward and backward are captured as CUDA graphs of the ops'
    own kernels, and replayed."""
    return torch.compile(fused_layer, fullgraph=True, dynamic=False, mode="reduce-overhead")


class GraphedProjectedLSTM(FusedProjectedLSTM):
    """:class:`FusedProjectedLSTM` replayed as CUDA graphs while training: a step's host launches
    a few graphs instead of each op's kernels one by one (at 128 rows the GPU waits for the host
    more than half a step: benchmarks/results/gpu_bf16_backward-2026-11-27.md). The graphs' inputs
    are copied into their static buffers at each replay, and their outputs live until the next
    step begins (the caller copies the state it carries: ``run_stack`` stacks it). Without CUDA,
    the compiled ops run as they are."""

    def layer_loop(self) -> LayerLoop:
        """The ops uncaptured when grad is off (inference, validation): with no backward pending,
        each call would start a new cudagraph-trees generation and overwrite the previous call's
        outputs while ``run_stack`` still reads them (the residual add)."""
        if not torch.is_grad_enabled():
            return fused_layer
        return graphed_layer()
