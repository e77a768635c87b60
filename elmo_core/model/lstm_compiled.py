"""The projected LSTM stack with each layer's step loop compiled by ``torch.compile``.

On a GPU the reference layer launches a dozen small kernels per step (the recurrent GEMM, three
sigmoids, two tanh, the clips, the projection, the mask's selects): 20 steps × 2 layers × 2
directions of them, forward and backward, in a Python loop. Compiled (Inductor, fixed shapes),
each layer's loop becomes one graph whose pointwise work is fused into a few kernels per step
around the GEMMs, with a fused backward. What is compiled is the reference layer's own
``forward``, so the two cannot drift apart; parameters, state dict, dropout and residuals are the
base class's. Works with the clips (unlike the cuDNN kernel); any CPU or CUDA device.

The first call of each shape compiles (seconds to a minute); a training run has one or two shapes
(training and validation windows), and every layer of both directions shares a graph.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from elmo_core.model.lstm import LayerCall, ProjectedLSTM, ProjectedLSTMLayer


def _layer_loop(
    layer: ProjectedLSTMLayer,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer(inputs, mask, h, c)


@functools.cache
def _compiled_layer_loop() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The compiled loop, made on first use: ``torch.compile`` imports Dynamo (about a second),
    which every import of the biLM would pay otherwise. Dynamo treats the layer's parameters as
    inputs, so one graph serves every layer of these shapes."""
    return torch.compile(_layer_loop, fullgraph=True, dynamic=False)


class CompiledProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer's masked step loop run as one compiled graph."""

    def layer_call(self, mask: torch.Tensor) -> LayerCall:
        def run_layer(
            index: int, inputs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            layer = self.layers[index]
            assert isinstance(layer, ProjectedLSTMLayer)
            return _compiled_layer_loop()(layer, inputs, mask, h, c)

        return run_layer
