"""Shared fixtures of the model tests: an independent NumPy reference of the biLM mathematics.

The reference is written the way bilm-tf states the model (row vectors, TF weight layouts, TF gate
order (i, j, f, o), the +1 forget bias added at run time, a plain per-step loop in float64), so a
comparison with our modules also checks the documented layout mapping.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def highway(x: np.ndarray, layers: list[dict[str, np.ndarray]]) -> np.ndarray:
    """bilm-tf ``high``: ``g = σ(x·W_carry + b)``, ``y = g·relu(x·W_transform + b) + (1−g)·x``."""
    for layer in layers:
        gate = _sigmoid(x @ layer["W_carry"] + layer["b_carry"])
        x = gate * np.maximum(x @ layer["W_transform"] + layer["b_transform"], 0.0) + (1 - gate) * x
    return x


def char_cnn(char_ids: np.ndarray, weights: dict, activation: str = "relu") -> np.ndarray:
    """``char_ids (N, W)`` -> ``(N, P)`` with explicit loops over filters and positions."""
    act = {"relu": lambda v: np.maximum(v, 0.0), "tanh": np.tanh}[activation]
    chars = weights["char_embed"][char_ids]  # (N, W, E)
    num_tokens, width, _ = chars.shape
    pooled = []
    for kernel, bias in weights["convolutions"]:  # kernel (w, E, n) as bilm-tf's W_cnn minus dim 0
        span = kernel.shape[0]
        windows = np.stack(
            [
                np.einsum("nwe,wek->nk", chars[:, p : p + span], kernel)
                for p in range(width - span + 1)
            ]
        )  # (positions, N, n)
        pooled.append(act(windows.max(axis=0) + bias))
    features = highway(np.concatenate(pooled, axis=1), weights["highway"])
    return features @ weights["W_proj"] + weights["b_proj"]


def lstm_cell(
    x: np.ndarray,
    h: np.ndarray,
    c: np.ndarray,
    cell: dict,
    cell_clip: float | None,
    proj_clip: float | None,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """TF ``LSTMCell`` with ``num_proj``: returns ``h', c'`` and pre-clip magnitudes."""
    gates = np.concatenate([x, h], axis=1) @ cell["W_0"] + cell["B"]
    i, j, f, o = np.split(gates, 4, axis=1)
    c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
    raw_c = np.abs(c).max()
    if cell_clip is not None:
        c = np.clip(c, -cell_clip, cell_clip)
    h = (_sigmoid(o) * np.tanh(c)) @ cell["W_P_0"]
    raw_h = np.abs(h).max()
    if proj_clip is not None:
        h = np.clip(h, -proj_clip, proj_clip)
    return h, c, {"max_abs_c": raw_c, "max_abs_h": raw_h}


def lstm_stack(
    inputs: np.ndarray,
    mask: np.ndarray,
    cells: list[dict],
    h0: np.ndarray,
    c0: np.ndarray,
    cell_clip: float | None,
    proj_clip: float | None,
    skip: bool,
    input_scales: list[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, dict]:
    """``inputs (B, T, I)``, ``mask (B, T)``: per-layer outputs, final h, c and pre-clip maxima.

    ``input_scales[k] (B, T, I)`` multiplies layer k's input (a fixed stand-in for dropout).
    """
    batch, steps, _ = inputs.shape
    h, c = h0.copy(), c0.copy()
    outputs = [np.zeros((batch, steps, h.shape[-1])) for _ in cells]
    seen = {"max_abs_c": 0.0, "max_abs_h": 0.0}
    for t in range(steps):
        layer_input = inputs[:, t]
        for k, cell in enumerate(cells):
            if input_scales is not None:
                layer_input = layer_input * input_scales[k][:, t]
            new_h, new_c, raw = lstm_cell(layer_input, h[k], c[k], cell, cell_clip, proj_clip)
            seen = {key: max(seen[key], raw[key]) for key in seen}
            keep = mask[:, t, None]
            out = new_h + layer_input if (skip and k > 0) else new_h
            out = np.where(keep, out, 0.0)
            h[k] = np.where(keep, new_h, h[k])
            c[k] = np.where(keep, new_c, c[k])
            outputs[k][:, t] = out
            layer_input = out
    return outputs, h, c, seen


def tf_cell_from_layer(layer: torch.nn.Module) -> dict[str, np.ndarray]:
    """Our ``ProjectedLSTMLayer`` in TF's layout: W_0 (in+P, 4H) in (i, j, f, o), B without +1."""
    hidden = layer.cell_dim
    weight = torch.cat([layer.input_weight, layer.recurrent_weight], dim=1).detach().double()
    i, f, g, o = weight.split(hidden, dim=0)
    bi, bf, bg, bo = layer.bias.detach().double().split(hidden)
    return {
        "W_0": torch.cat([i, g, f, o]).T.numpy(),
        "B": torch.cat([bi, bg, bf - 1.0, bo]).numpy(),
        "W_P_0": layer.projection_weight.detach().double().T.numpy(),
    }


def tf_char_cnn_from_module(encoder: torch.nn.Module) -> dict:
    """Our ``CharCNN`` weights in bilm-tf's row-vector layouts."""

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().double().numpy()

    return {
        "char_embed": arr(encoder.char_embedding.weight),
        "convolutions": [
            (arr(conv.weight).transpose(2, 1, 0), arr(conv.bias)) for conv in encoder.convolutions
        ],
        "highway": [
            {
                "W_carry": arr(carry.weight).T,
                "b_carry": arr(carry.bias),
                "W_transform": arr(transform.weight).T,
                "b_transform": arr(transform.bias),
            }
            for transform, carry in zip(
                encoder.highway.transform, encoder.highway.carry, strict=True
            )
        ],
        "W_proj": arr(encoder.projection.weight).T,
        "b_proj": arr(encoder.projection.bias),
    }


@pytest.fixture
def numpy_reference() -> SimpleNamespace:
    """The reference functions above, for tests that import nothing by path."""
    return SimpleNamespace(
        highway=highway,
        char_cnn=char_cnn,
        lstm_cell=lstm_cell,
        lstm_stack=lstm_stack,
        tf_cell_from_layer=tf_cell_from_layer,
        tf_char_cnn_from_module=tf_char_cnn_from_module,
    )
