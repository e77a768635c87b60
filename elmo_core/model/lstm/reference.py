"""The reference projected LSTM: one direction's stack of clipped layers, TF ``LSTMCell``'s cell.

Every variant subclasses :class:`ProjectedLSTM`; :func:`run_layer` is what their parity tests
compare against. The cell and the masking rule are specified in
docs/architecture.md, "LSTM cell".

Shape legend: B rows, T window, P projection, H cell, L layers, I layer input width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from elmo_core.config import LSTMConfig

# One layer over a batch: (index, inputs (B, T, I), h (B, P), c (B, H)) -> outputs, h', c'.
LayerCall = Callable[
    [int, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]


SATURATED_SHARE = 0.5  # of a layer's cells at the clip: the row's state has locked up


class LSTMState(NamedTuple):
    """The carried state of a stack: ``h (L, B, P)`` projected outputs and ``c (L, B, H)`` cells."""

    h: torch.Tensor
    c: torch.Tensor

    def detach(self) -> LSTMState:
        """Cut the graph between windows (truncated BPTT)."""
        return LSTMState(self.h.detach(), self.c.detach())

    def saturated_rows(self, cell_clip: float, share: float = SATURATED_SHARE) -> torch.Tensor:
        """``(B,)`` rows where, in some layer, more than ``share`` of the cells sit at
        ±``cell_clip``: a locked-up state, which predicts at tens of nats a token and, carried,
        never recovers."""
        at_clip = self.c.abs() >= cell_clip * (1 - 1e-3)  # (L, B, H)
        return (at_clip.float().mean(dim=-1) > share).any(dim=0)  # (B,)


class LayerWeights(NamedTuple):
    """One layer's parameters as its step loop multiplies by them; with a leading ``D`` when the
    two directions' layers run together (:mod:`elmo_core.model.lstm.directions`)."""

    input: torch.Tensor  # (I, 4H) or (D, I, 4H): input_weightᵀ
    recurrent: torch.Tensor  # (P, 4H) or (D, P, 4H): recurrent_weightᵀ
    bias: torch.Tensor  # (4H,) or (D, 1, 4H)
    projection: torch.Tensor  # (H, P) or (D, H, P): projection_weightᵀ

    def for_autocast(self) -> LayerWeights:
        """Cast once to the autocast dtype, if autocast is on: the step loop's GEMMs would each
        cast their (transposed, so uncached) weights again, 20 times a window."""
        device_type = self.recurrent.device.type
        if device_type == "meta" or not torch.is_autocast_enabled(device_type):  # meta: no autocast
            return self
        dtype = torch.get_autocast_dtype(device_type)
        return LayerWeights(*(weight.to(dtype) for weight in self))


# A layer's masked step loop: (inputs, mask, h, c, weights, cell_clip, proj_clip) -> outputs, h, c.
LayerLoop = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        LayerWeights,
        float | None,
        float | None,
    ],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]


def run_layer(
    inputs: torch.Tensor,
    mask: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    weights: LayerWeights,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The masked step loop: ``inputs (…, B, T, I)``, ``mask (…, B, T)``, ``h (…, B, P)``,
    ``c (…, B, H)`` -> outputs ``(…, B, T, P)``, ``h``, ``c``; ``…`` is empty, or ``D`` with
    weights stacked over the directions. The input GEMM for all steps is done before the loop."""
    weights = weights.for_autocast()
    lead = inputs.shape[:-3]  # () or (D,)
    flat = inputs.reshape(*lead, -1, inputs.shape[-1])  # (…, B·T, I)
    input_gates = _add_product(weights.bias, flat, weights.input)  # one GEMM for all steps
    input_gates = input_gates.view(*inputs.shape[:-1], -1)  # (…, B, T, 4H)
    step_mask = mask.unsqueeze(-1)  # (…, B, T, 1)
    outputs = []
    # unbind, not input_gates[..., t, :]: its backward stacks the T step gradients once, where
    # indexing would add a zero-filled (…, B, T, 4H) gradient per step.
    for t, step_gates in enumerate(input_gates.unbind(-2)):
        gates = _add_product(step_gates, h, weights.recurrent)  # (…, B, 4H)
        in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)  # 4 × (…, B, H)
        new_c = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(candidate)
        if cell_clip is not None:
            new_c = new_c.clamp(-cell_clip, cell_clip)
        new_h = torch.matmul(torch.sigmoid(out_gate) * torch.tanh(new_c), weights.projection)
        if proj_clip is not None:
            new_h = new_h.clamp(-proj_clip, proj_clip)  # (…, B, P)
        keep = step_mask[..., t, :]  # (…, B, 1)
        h = torch.where(keep, new_h, h)
        c = torch.where(keep, new_c, c)
        outputs.append(new_h * keep)  # zero where masked
    return torch.stack(outputs, dim=-2), h, c  # (…, B, T, P)


def _add_product(base: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``base + x·weight``, the addition done by the GEMM itself (batched when ``x`` is 3-D)."""
    return (torch.addmm if x.dim() == 2 else torch.baddbmm)(base, x, weight)


class ProjectedLSTMLayer(nn.Module):
    """One clipped, projected LSTM layer: its parameters, run by :func:`run_layer`.

    Per step, with ``x`` the layer input and ``(h, c)`` the carried state::

        i, f, g, o = x·W_inputᵀ + h·W_recurrentᵀ + b          (PyTorch gate order)
        c' = clip(σ(f)·c + σ(i)·tanh(g), ±cell_clip)
        h' = clip((σ(o)·tanh(c'))·W_projectionᵀ, ±proj_clip)

    Where the mask is False the state is copied through and the output is zero, so padding never
    changes real tokens' outputs. Against bilm-tf (mapped only by :mod:`elmo_core.interop.bilm_tf`):
    ``input_weight (4H, in)`` and ``recurrent_weight (4H, P)`` are the row blocks of TF's
    ``W_0 (in + P, 4H)`` transposed, TF's gates ordered (i, j, f, o); ``bias`` is the effective
    bias, TF's ``B`` plus the forget bias 1.0 it adds at run time; ``projection_weight (P, H)`` is
    ``W_P_0 (H, P)`` transposed.
    """

    def __init__(
        self,
        input_dim: int,
        cell_dim: int,
        projection_dim: int,
        cell_clip: float | None,
        proj_clip: float | None,
    ) -> None:
        super().__init__()
        self.cell_dim = cell_dim
        self.projection_dim = projection_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.input_weight = nn.Parameter(torch.empty(4 * cell_dim, input_dim))
        self.recurrent_weight = nn.Parameter(torch.empty(4 * cell_dim, projection_dim))
        self.bias = nn.Parameter(torch.empty(4 * cell_dim))
        self.projection_weight = nn.Parameter(torch.empty(projection_dim, cell_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TF's defaults: Glorot-uniform over the joint ``W_0 (in + P, 4H)``; bias 0, forget 1.0."""
        fan_in = self.input_weight.shape[1] + self.projection_dim
        bound = math.sqrt(6.0 / (fan_in + 4 * self.cell_dim))
        nn.init.uniform_(self.input_weight, -bound, bound)
        nn.init.uniform_(self.recurrent_weight, -bound, bound)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[self.cell_dim : 2 * self.cell_dim] = 1.0  # the forget gate's slice
        nn.init.xavier_uniform_(self.projection_weight)

    def weights(self) -> LayerWeights:
        return LayerWeights(
            self.input_weight.t(),
            self.recurrent_weight.t(),
            self.bias,
            self.projection_weight.t(),
        )

    def forward(
        self, inputs: torch.Tensor, mask: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``inputs (B, T, I)``, ``mask (B, T)``, ``h (B, P)``, ``c (B, H)`` -> outputs, h, c."""
        return run_layer(inputs, mask, h, c, self.weights(), self.cell_clip, self.proj_clip)


class ProjectedLSTM(nn.Module):
    """``num_layers`` projected LSTM layers of one direction, with input dropout and residuals.

    ``forward`` returns every layer's output (before any top-output dropout) and the new state;
    the state is an argument and a return value, never kept in the module. Dropout applies to
    every layer's input, the token embedding included (bilm-tf's ``DropoutWrapper``); layers ≥ 1
    add that input to their clipped output when ``use_skip_connections`` (its
    ``ResidualWrapper``, so those outputs may exceed ``±proj_clip``).
    """

    def __init__(self, config: LSTMConfig, input_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            ProjectedLSTMLayer(
                input_dim if index == 0 else config.projection_dim,
                config.cell_dim,
                config.projection_dim,
                config.cell_clip,
                config.proj_clip,
            )
            for index in range(config.num_layers)
        )

    @property
    def state_dtype(self) -> torch.dtype:
        """The carried state's dtype: the parameters', so that under autocast the cells and the
        state carried between windows stay float32 (as bilm-tf's) and the Triton steps take them."""
        return next(self.parameters()).dtype

    def zero_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> LSTMState:
        num_layers, cfg = len(self.layers), self.config
        dtype = dtype or self.state_dtype
        return LSTMState(
            torch.zeros(num_layers, batch_size, cfg.projection_dim, device=device, dtype=dtype),
            torch.zeros(num_layers, batch_size, cfg.cell_dim, device=device, dtype=dtype),
        )

    def forward(
        self, inputs: torch.Tensor, mask: torch.Tensor, state: LSTMState | None = None
    ) -> tuple[list[torch.Tensor], LSTMState]:
        """``inputs (B, T, I)``, ``mask (B, T)`` bool -> ``[(B, T, P)] * L`` and the new state."""
        if state is None:
            state = self.zero_state(inputs.shape[0], inputs.device)
        return self.run_stack(inputs, state, self.layer_call(mask))

    def run_stack(
        self, inputs: torch.Tensor, state: LSTMState, run_layer: LayerCall
    ) -> tuple[list[torch.Tensor], LSTMState]:
        """Every layer in turn by ``run_layer``, with this stack's dropout and residuals; leading
        dimensions of ``inputs`` and ``state`` (the directions run together) pass through."""
        outputs, final_h, final_c = [], [], []
        layer_input = inputs  # (…, B, T, I)
        for index in range(len(self.layers)):
            dropped = self.dropout(layer_input)  # (…, B, T, I)
            output, h, c = run_layer(index, dropped, state.h[index], state.c[index])
            if index > 0 and self.config.use_skip_connections:
                output = output + dropped  # after the clip, as bilm-tf's ResidualWrapper
            outputs.append(output)  # (…, B, T, P)
            final_h.append(h)
            final_c.append(c)
            layer_input = output
        return outputs, LSTMState(torch.stack(final_h), torch.stack(final_c))

    def layer_loop(self) -> LayerLoop:
        """What runs a layer's masked step loop: the one point where a faster loop plugs in."""
        return run_layer

    def layer_call(self, mask: torch.Tensor) -> LayerCall:
        """How each layer runs over a batch with this ``mask (B, T)``: the layer loop by default.

        A variant whose kernel needs more than the loop (cuDNN's lengths) overrides this; it is
        asked once per ``forward``, so what it derives from the mask (lengths, a host-side check)
        is paid once, not once per layer.
        """
        loop = self.layer_loop()

        def run_layer(
            index: int, inputs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            layer = self.layers[index]
            assert isinstance(layer, ProjectedLSTMLayer)
            return loop(inputs, mask, h, c, layer.weights(), layer.cell_clip, layer.proj_clip)

        return run_layer
