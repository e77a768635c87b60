"""The one-command demo's own: "bank" in two senses, through the registered biLM as a user loads it.

The token layer sees only the word's characters, so both senses get one vector there; the LSTM
layers read the sentence, so the two vectors part. The analysis measures how well each layer tells
senses apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlflow
import numpy as np
import pandas as pd

from pipelines.tracking.stage_runs import use_tracking

CHAMPION_URI = "models:/elmo-bilm@champion"
WORD = "bank"
SENTENCES = ("She went to the bank to withdraw money.", "They sat on the bank of the river.")
SENSE_NOTE = (
    "one pair of vectors says little; the sense probe of the analysis measures each layer on "
    "23 senses of 10 words"
)


def layer_distances(
    first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]
) -> list[float]:
    """Per layer, the cosine distance (1 − cosine similarity, in [0, 2]) between a word's vector
    in one sentence (``first``, shape (L, D): one vector per layer) and in another (``second``)."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)  # (L, D)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)  # (L,)
    cosine = (a * b).sum(axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)  # (L,)
    return [float(value) for value in np.clip(1.0 - cosine, 0.0, 2.0)]


def sense_demo(uri: str = CHAMPION_URI) -> str:
    """The two "bank" sentences through the registered biLM, and per layer how far apart the two
    "bank" vectors are."""
    use_tracking()
    model = mlflow.pyfunc.load_model(uri)
    output = model.predict(pd.DataFrame({"sentence": list(SENTENCES)}))
    vectors = [
        [layer[tokens.index(WORD)] for layer in layers]  # (L, D): the word in every layer
        for tokens, layers in zip(output["tokens"], output["embeddings"], strict=True)
    ]
    lines = [
        f"'{WORD}' in two senses, from mlflow.pyfunc.load_model({uri!r}).predict(...):",
        *[f"  {index}: {' '.join(tokens)}" for index, tokens in enumerate(output["tokens"], 1)],
        f"  cosine distance between the two '{WORD}' vectors, per layer:",
    ]
    for layer, distance in enumerate(layer_distances(*vectors)):
        name = "token layer (characters only)" if layer == 0 else f"LSTM layer {layer}"
        lines.append(f"    {layer}  {name:<30} {distance:.6f}")
    return "\n".join([*lines, f"  {SENSE_NOTE}"])
