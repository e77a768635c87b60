"""The projected LSTM stack run by PyTorch's fused LSTM kernel (cuDNN on GPU), for unclipped models.

``nn.LSTM(proj_size=P)`` is exactly our cell without the two clips
(docs/architecture.md, "Where a step's time goes") and our parameters map onto it one to one, so
only the layer call is overridden. Right-padded rows are packed by length; any other mask falls
back to the reference loop.

Shape legend: B rows, T window, P projection, H cell, L layers, I layer input width.
"""

from __future__ import annotations

import warnings
from typing import cast

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from elmo_core.config import LSTMConfig
from elmo_core.errors import ConfigError
from elmo_core.model.lstm.reference import LayerCall, ProjectedLSTM, ProjectedLSTMLayer

# Our weights are separate parameters, not one flattened buffer, and the CPU kernel has no oneDNN
# path with projections; both are expected here and only cost a copy or a slower CPU kernel.
_EXPECTED_WARNINGS = ("RNN module weights are not part", "LSTM with projections is not supported")


class CudnnProjectedLSTM(ProjectedLSTM):
    """:class:`ProjectedLSTM` with each layer run by one fused ``nn.LSTM`` call; no clipping."""

    def __init__(self, config: LSTMConfig, input_dim: int, dropout: float = 0.0) -> None:
        if config.cell_clip is not None or config.proj_clip is not None:
            raise ConfigError(
                "the cuDNN LSTM cannot clip: set model.lstm.cell_clip and model.lstm.proj_clip "
                "to null, or choose the reference implementation",
                key="model.lstm_impl",
            )
        super().__init__(config, input_dim, dropout)
        # Shape-only modules on the meta device, kept in a plain list so that they are neither
        # parameters nor moved by .to(): each call substitutes the layer's own tensors.
        self._kernels = [
            nn.LSTM(
                input_dim if index == 0 else config.projection_dim,
                config.cell_dim,
                proj_size=config.projection_dim,
                batch_first=True,
                device="meta",
            )
            for index in range(config.num_layers)
        ]

    def layer_call(self, mask: torch.Tensor) -> LayerCall:
        """One kernel call per layer for a right-padded ``mask (B, T)``, else the masked loop."""
        lengths = mask.sum(dim=1)  # (B,)
        steps = torch.arange(mask.shape[1], device=mask.device)  # (T,)
        if not torch.equal(mask, steps < lengths.unsqueeze(1)):
            return super().layer_call(mask)  # holes in a row: the masked loop
        # Packing needs the lengths on the host; a batch without padding needs no packing.
        packed_lengths = None if bool(mask.all()) else lengths.clamp(min=1).cpu()

        def run_layer(
            index: int, inputs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            layer = cast(ProjectedLSTMLayer, self.layers[index])
            return _run_layer(
                self._kernels[index], layer, inputs, mask, lengths, packed_lengths, h, c
            )

        return run_layer


def _run_layer(
    kernel: nn.LSTM,
    layer: ProjectedLSTMLayer,
    inputs: torch.Tensor,
    mask: torch.Tensor,
    lengths: torch.Tensor,
    packed_lengths: torch.Tensor | None,
    h: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer over right-padded rows: outputs ``(B, T, P)`` zero where masked, ``h``, ``c``.

    ``packed_lengths`` are the host-side lengths to pack by (an empty row runs one step, undone
    below), or None when no row has padding.
    """
    weights = {
        "weight_ih_l0": layer.input_weight,
        "weight_hh_l0": layer.recurrent_weight,
        "bias_ih_l0": layer.bias,
        "bias_hh_l0": torch.zeros_like(layer.bias),
        "weight_hr_l0": layer.projection_weight,
    }
    initial = (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous())  # (1, B, P), (1, B, H)
    sequence = (
        inputs
        if packed_lengths is None
        else pack_padded_sequence(inputs, packed_lengths, batch_first=True, enforce_sorted=False)
    )
    with warnings.catch_warnings():
        for message in _EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        result, (new_h, new_c) = functional_call(kernel, weights, (sequence, initial))
    if packed_lengths is None:  # batch-first output is a transposed view; dropout follows memory
        return result.contiguous(), new_h[0], new_c[0]
    output, _ = pad_packed_sequence(result, batch_first=True, total_length=inputs.shape[1])
    has_tokens = (lengths > 0).unsqueeze(1)  # (B, 1)
    return (
        output * mask.unsqueeze(-1),  # (B, T, P)
        torch.where(has_tokens, new_h[0], h),  # (B, P)
        torch.where(has_tokens, new_c[0], c),  # (B, H)
    )
