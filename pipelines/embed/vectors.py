"""Sentences → ELMo vectors from a frozen biLM, as ``elmo embed --output`` asks for them.

AllenNLP's ``elmo`` choices (``all``, ``top``, and ``mix`` for its ``--average``) plus ``mean``,
a sentence vector. Shapes: N sentences, L layers, T tokens, P projection.
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
