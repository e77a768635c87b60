"""The projected LSTM stack with each layer's step loop compiled by ``torch.compile``.

It compiles the reference's own :func:`~elmo_core.model.lstm.reference.run_layer`, so the two
cannot drift, and unlike cuDNN it keeps the clips. Each new shape compiles once.
"""

from __future__ import annotations

import functools

import torch

from elmo_core.model.lstm.reference import LayerLoop, ProjectedLSTM, run_layer


@functools.cache
def _compiled_layer_loop(mode: str | None) -> LayerLoop:
    """The compiled loop, made on first use: ``torch.compile`` imports Dynamo (about a second),
    which every import of the biLM would pay otherwise. The weights are its inputs, so one graph
    serves every layer of these shapes."""
    return torch.compile(run_layer, fullgraph=True, dynamic=False, mode=mode)


class CompiledProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer's masked step loop run as one compiled graph."""

    compile_mode: str | None = None  # torch.compile's default: Inductor's fused kernels

    def layer_loop(self) -> LayerLoop:
        return _compiled_layer_loop(self.compile_mode)


class GraphedProjectedLSTM(CompiledProjectedLSTM):
    """The compiled loop replayed as CUDA graphs (``mode="reduce-overhead"``): each layer's
    forward and backward graphs are captured once and replayed, so a step launches a few graphs
    instead of its kernels one by one. The shapes are fixed in training; the graphs' inputs (the
    activations, the weights, the carried state) are copied into their static buffers at each
    replay, and its outputs live until the next step begins (the caller copies the state it
    carries: ``run_stack`` stacks it). Without CUDA it runs as the compiled loop."""

    compile_mode = "reduce-overhead"

    def layer_loop(self) -> LayerLoop:
        """The compiled loop without CUDA graphs when grad is off (inference, validation): with
        no backward pending, each call starts a new cudagraph-trees generation, which overwrites
        the previous call's outputs while ``run_stack`` still reads them (the residual add)."""
        if not torch.is_grad_enabled():
            return _compiled_layer_loop(None)
        return super().layer_loop()
