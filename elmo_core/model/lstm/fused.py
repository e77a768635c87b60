"""The fused variant: each layer's step loop as one op, the training op or the inference op
(:mod:`~elmo_core.model.lstm.graphed` replays them as CUDA graphs).

The inference op runs where no gradient can reach the layer's inputs, state or weights, and keeps
nothing for a backward. Custom ops run below autocast, so here the weights are cast as it would.
"""

from __future__ import annotations

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
