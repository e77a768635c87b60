"""The projected LSTM stack with each layer's step loop compiled by ``torch.compile``.

It compiles the reference's own :func:`~elmo_core.model.lstm.reference.run_layer`, so the two
cannot drift, and unlike cuDNN it keeps the clips. Each new shape compiles once.
"""

from __future__ import annotations

import functools

import torch

from elmo_core.model.lstm.reference import LayerLoop, ProjectedLSTM, run_layer


@functools.cache
def _compiled_layer_loop() -> LayerLoop:
    """The compiled loop, made on first use: ``torch.compile`` imports Dynamo (about a second),
    which every import of the biLM would pay otherwise. The weights are its inputs, so one graph
    serves every layer of these shapes."""
    return torch.compile(run_layer, fullgraph=True, dynamic=False)


class CompiledProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer's masked step loop run as one compiled graph."""

    def layer_loop(self) -> LayerLoop:
        return _compiled_layer_loop()
