"""Highway layers of the token encoder (Srivastava et al. 2015), as bilm-tf computes them.

Per layer, with row vectors and the gate called "carry" as in the original::

    g = σ(x·W_carry + b_carry)
    y = g ⊙ relu(x·W_transform + b_transform) + (1 − g) ⊙ x

The original's "carry" gate multiplies the *transform* branch (DESIGN.md §3). A torch ``Linear``
stores ``W`` transposed (``weight = Wᵀ``); the matrices are square, so a missing transpose in
weight interop would pass every shape check — the tests use non-symmetric weights for that reason.

Shape legend: B rows, T window, F filters (the highway width).
"""

from __future__ import annotations

import math

import torch
from torch import nn

CARRY_BIAS_INIT = -2.0  # bilm-tf: start close to the identity, the gate mostly closed


class Highway(nn.Module):
    """``num_layers`` highway layers of width ``dim``; ``forward`` maps ``(..., F) -> (..., F)``."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.transform = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_layers))
        self.carry = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation: N(0, 1/dim) weights, transform bias 0, carry bias −2."""
        std = math.sqrt(1.0 / self.dim)
        for transform, carry in zip(self.transform, self.carry, strict=True):
            assert isinstance(transform, nn.Linear) and isinstance(carry, nn.Linear)
            nn.init.normal_(transform.weight, std=std)
            nn.init.zeros_(transform.bias)
            nn.init.normal_(carry.weight, std=std)
            nn.init.constant_(carry.bias, CARRY_BIAS_INIT)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = inputs  # (..., F)
        for transform, carry in zip(self.transform, self.carry, strict=True):
            gate = torch.sigmoid(carry(x))  # (..., F)
            x = gate * torch.relu(transform(x)) + (1.0 - gate) * x  # (..., F)
        return x
