"""The task-specific weighting of biLM layers: ``ELMo = γ · Σ_j softmax(w)_j · h_j`` (Eq. 1).

Matches bilm-tf's ``weight_layers`` and AllenNLP's ``ScalarMix``, including the optional layer
norm: one mean and variance over all unmasked elements of a layer, no affine, ``eps = 1e-12``.

Shapes: B rows, T window, D layer width (2P for the biLM), L layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

LAYER_NORM_EPS = 1e-12


class ScalarMix(nn.Module):
    """A softmax-normalised, scaled sum of ``num_layers`` same-shaped layers."""

    def __init__(
        self,
        num_layers: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        initial = (
            [0.0] * num_layers
            if initial_scalar_parameters is None
            else list(initial_scalar_parameters)
        )
        if len(initial) != num_layers:
            raise ValueError(f"{len(initial)} initial scalar parameters for {num_layers} layers")
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(
            torch.tensor(initial), requires_grad=trainable
        )  # (L,)
        self.gamma = nn.Parameter(torch.tensor([1.0]), requires_grad=trainable)  # (1,)

    def weights(self) -> torch.Tensor:
        """The normalised layer weights ``softmax(w)``. → (L,)"""
        return torch.softmax(self.scalar_parameters, dim=0)

    def l2_penalty(self, lambda_: float = 0.001) -> torch.Tensor:
        """``λ‖w‖²`` on the unnormalised weights (bilm-tf's ``l2_coef``; the paper's λ = 0.001)."""
        return lambda_ * self.scalar_parameters.pow(2).sum()

    def forward(
        self, layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mix ``layers`` (each (B, T, D)); ``mask`` (B, T) is needed for the layer norm."""
        if len(layers) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} layers, got {len(layers)}")
        if self.do_layer_norm and mask is None:
            raise ValueError("layer norm needs the mask of real positions")
        weights = self.weights()  # (L,)
        mixed = torch.zeros_like(layers[0])  # (B, T, D)
        for weight, layer in zip(weights, layers, strict=True):
            if self.do_layer_norm:
                assert mask is not None
                layer = _masked_layer_norm(layer, mask)
            mixed = mixed + weight * layer
        return self.gamma * mixed


def _masked_layer_norm(layer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalise with one mean and variance over all unmasked elements (bilm-tf ``_do_ln``)."""
    broadcast_mask = mask.unsqueeze(-1).to(layer.dtype)  # (B, T, 1)
    count = broadcast_mask.sum() * layer.shape[-1]  # ()
    masked = layer * broadcast_mask  # (B, T, D)
    mean = masked.sum() / count
    variance = (((masked - mean) * broadcast_mask) ** 2).sum() / count
    return (layer - mean) / torch.sqrt(variance + LAYER_NORM_EPS)  # (B, T, D)
