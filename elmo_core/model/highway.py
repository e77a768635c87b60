"""Highway layers of the token encoder (Srivastava et al. 2015), as bilm-tf computes them.

Shape legend: B rows, T window, F filters (the highway width).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

CARRY_BIAS_INIT = -2.0  # bilm-tf: start close to the identity, the gate mostly closed
# Without bf16 GEMMs in hardware (avx512_bf16 or AMX) a CPU's bf16 is emulated and slower.
CPU_HAS_BF16_GEMMS = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class Highway(nn.Module):
    """``num_layers`` highway layers of width ``dim``; ``forward`` maps ``(..., F) -> (..., F)``."""

    def __init__(self, dim: int, num_layers: int, cpu_bf16: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.cpu_bf16 = cpu_bf16
        self.transform = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_layers))
        self.carry = nn.ModuleList(nn.Linear(dim, dim) for _ in range(num_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation: N(0, 1/dim) weights, transform bias 0, carry bias −2."""
        std = math.sqrt(1.0 / self.dim)
        for transform, carry in zip(self.transform, self.carry, strict=True):
            assert isinstance(transform, nn.Linear) and isinstance(carry, nn.Linear)
            # Square matrices: a missing transpose in weight interop would pass every shape
            # check, so the tests use non-symmetric weights.
            nn.init.normal_(transform.weight, std=std)
            nn.init.zeros_(transform.bias)
            nn.init.normal_(carry.weight, std=std)
            nn.init.constant_(carry.bias, CARRY_BIAS_INIT)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Per layer ``g = σ(carry(x))``, ``y = g ⊙ relu(transform(x)) + (1 − g) ⊙ x``.

        bilm-tf's "carry" gate multiplies the *transform* branch
        (docs/architecture.md, "Token encoder"). With
        ``cpu_bf16`` a CPU training forward with bf16 GEMMs runs under bf16 autocast; ``eval()``
        stays float32, so inference and parity with bilm-tf are unchanged.
        """
        in_bf16 = (
            self.cpu_bf16 and self.training and inputs.device.type == "cpu" and CPU_HAS_BF16_GEMMS
        )
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16) if in_bf16 else contextlib.nullcontext()
        )
        x = inputs  # (..., F)
        with autocast:  # entered only to turn it on: an outer autocast still applies otherwise
            for transform, carry in zip(self.transform, self.carry, strict=True):
                gate = torch.sigmoid(carry(x))  # (..., F)
                x = gate * torch.relu(transform(x)) + (1.0 - gate) * x  # (..., F)
        return x.to(inputs.dtype) if in_bf16 else x
