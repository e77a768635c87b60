"""Sentences → ELMo vectors from a frozen biLM, as ``elmo embed --output`` asks for them.

The choices are those of AllenNLP's ``elmo`` command (``--all``, ``--top``, ``--average``) plus
a sentence vector:

- ``all``: every layer, ``(L, T, 2P)`` — ``[x; x]``, then ``[f_k; b_k]`` per LSTM layer;
- ``top``: the top LSTM layer, ``(T, 2P)``;
- ``mix``: the equal-weight average of the layers, ``(T, 2P)`` (AllenNLP's ``--average``; an
  ``Elmo`` scalar mix with its weights at their initial value, softmax(0) = 1/L, and γ = 1);
- ``mean``: the ``mix`` averaged over the sentence's tokens, ``(2P,)``.

Inference follows ELMo's defaults (DESIGN.md §3): eval mode, stateless (the biLM keeps no state
between calls and masks padding, so a sentence's vectors do not depend on its batch), boundary
tokens stripped. Sentences are sorted by length before batching, so a batch pads little.

Shapes: N sentences in a batch, L layers (token layer + LSTM layers), T tokens, P projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import bilm_layers

Output = Literal["all", "top", "mix", "mean"]
OUTPUTS: tuple[Output, ...] = ("all", "top", "mix", "mean")


def embed_sentences(
    bilm: BiLM, sentences: Sequence[Sequence[str]], output: Output, batch_size: int
) -> list[np.ndarray]:
    """Each sentence's float32 vectors (shapes in the module doc), in input order.

    A sentence without tokens gets arrays with no token rows (zeros for ``mean``).
    """
    dim = 2 * bilm.config.lstm.projection_dim
    vectors = [empty_vectors(bilm.num_layers, dim, output) for _ in sentences]
    order = sorted(
        (index for index, tokens in enumerate(sentences) if tokens),
        key=lambda index: len(sentences[index]),
    )
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        selected = _select(bilm_layers(bilm, [sentences[i] for i in rows]), output)
        for row, index in enumerate(rows):
            real = selected[row, ..., : len(sentences[index]), :]  # (L, T_i, 2P) or (T_i, 2P)
            if output == "mean":
                real = real.mean(dim=-2)  # (2P,)
            vectors[index] = real.float().cpu().numpy()
    return vectors


def empty_vectors(num_layers: int, dim: int, output: Output) -> np.ndarray:
    """The vectors of a sentence without tokens."""
    shapes = {"all": (num_layers, 0, dim), "top": (0, dim), "mix": (0, dim), "mean": (dim,)}
    return np.zeros(shapes[output], dtype=np.float32)


def _select(layers: torch.Tensor, output: Output) -> torch.Tensor:
    """``layers (N, L, T, 2P)`` → all of them, the top one or their mean ``(N, T, 2P)``."""
    if output == "all":
        return layers
    if output == "top":
        return layers[:, -1]  # (N, T, 2P)
    return layers.mean(dim=1)  # (N, T, 2P)
