"""The biLM as an MLflow pyfunc model: sentences in, per-token ELMo layers out.

This file is also the model's code file (MLflow models-from-code), so loading unpickles nothing.
Shapes: N sentences in a batch, T tokens, L layers, P projection.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel, PythonModelContext
from mlflow.types.schema import AnyType, Array, ColSpec, ParamSchema, ParamSpec, Schema

from elmo_core.errors import ConfigError, DataError
from elmo_core.model.bilm import BiLM
from elmo_core.model.elmo import bilm_layers
from elmo_core.text.tokenize import Tokenizer
from pipelines.serving.bilm_loader import (
    BILM_ARTIFACT,
    MANIFEST_ARTIFACT,
    load_bilm,
    manifest_tokenizer,
    resolve_bilm,
)
from pipelines.serving.pyfunc_request import (
    BATCH_SIZE_SPEC,
    DEFAULT_BATCH_SIZE,
    RequestLimits,
    batch_size_param,
    checked_params,
    mlflow_errors,
    token_lists,
    watch_dropped_params,
)

SENTENCE_COLUMN = "sentence"
TOKENS_COLUMN = "tokens"
EMBEDDINGS_COLUMN = "embeddings"

Output = Literal["layers", "layer", "mix"]
OUTPUTS: tuple[Output, ...] = ("layers", "layer", "mix")


@dataclass(frozen=True)
class EmbedOptions:
    """What ``predict``'s ``params`` ask for; the defaults are the signature's.

    ``layers`` returns every layer ``(L, T, 2P)``; ``layer`` one of them ``(T, 2P)`` (negative
    counts from the top); ``mix`` the weighted sum ``Σ_j weights_j · h_j`` ``(T, 2P)``, with
    ``weights`` used as given (uniform ``1/L`` when empty; a trained mix's are
    ``γ · softmax(s)``). ``mean_pool`` averages over the tokens: one vector (or ``L`` vectors)
    per sentence, None for a sentence without tokens (whose per-token outputs are empty): the
    mean of no vectors is undefined, and zeros would pass for an embedding.
    """

    output: Output = "layers"
    layer: int = -1
    weights: tuple[float, ...] = ()
    mean_pool: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> EmbedOptions:
        """The options of ``params``; an unknown name (see :func:`checked_params`) or a bad value
        is a ConfigError naming its ``params.<name>`` key."""
        given = checked_params(params, cls.__dataclass_fields__)
        output = given.get("output", cls.output)
        if output not in OUTPUTS:
            raise ConfigError(
                f"output must be one of {list(OUTPUTS)}, not {output!r}", key="params.output"
            )
        weights = given.get("weights")
        return cls(
            output=cast(Output, output),
            layer=int(given.get("layer", cls.layer)),
            weights=tuple(float(w) for w in (weights if weights is not None else ())),
            mean_pool=bool(given.get("mean_pool", cls.mean_pool)),
            batch_size=batch_size_param(given),
        )


def model_signature() -> ModelSignature:
    """Inputs: a ``sentence`` (raw text) or a ``tokens`` column; outputs: tokens + embeddings.

    The embeddings' nesting depends on ``output`` and ``mean_pool``, so their type is ``Any``.
    """
    inputs = Schema(
        [
            ColSpec("string", SENTENCE_COLUMN, required=False),
            ColSpec(Array("string"), TOKENS_COLUMN, required=False),
        ]
    )
    outputs = Schema(
        [ColSpec(Array("string"), TOKENS_COLUMN), ColSpec(AnyType(), EMBEDDINGS_COLUMN)]
    )
    defaults = EmbedOptions()
    params = ParamSchema(
        [
            ParamSpec("output", "string", defaults.output),
            ParamSpec("layer", "long", defaults.layer),
            ParamSpec("weights", "double", [], shape=(-1,)),
            ParamSpec("mean_pool", "boolean", defaults.mean_pool),
            BATCH_SIZE_SPEC,
        ]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=params)


class BiLMEmbedder(PythonModel):
    """Tokenizes as the training data was, runs the frozen biLM, returns its layers per token."""

    def __init__(self) -> None:
        self._bilm: BiLM | None = None
        self._tokenizer: Tokenizer | None = None
        self._limits = RequestLimits()

    def load_context(self, context: PythonModelContext) -> None:
        watch_dropped_params()
        self.load(context.artifacts[BILM_ARTIFACT], context.artifacts[MANIFEST_ARTIFACT])

    def load(self, bilm_dir: str | Path, manifest_file: str | Path) -> None:
        """Load our biLM directory, the manifest's tokenizer and the request limits (what
        ``load_context`` does)."""
        self._limits = RequestLimits.from_env()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self._bilm = load_bilm(resolve_bilm(bilm_dir)).bilm.to(device)
        tokenizer = manifest_tokenizer(Path(manifest_file))
        if tokenizer is None:
            raise DataError("the manifest names no tokenizer", path=str(manifest_file))
        self._tokenizer = Tokenizer.from_manifest(tokenizer)

    @property
    def bilm(self) -> BiLM:
        """The loaded biLM (eval mode, stateless): build an ``Elmo`` on it for adaptation."""
        if self._bilm is None:
            raise RuntimeError("BiLMEmbedder used before load_context")
        return self._bilm

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RuntimeError("BiLMEmbedder used before load_context")
        return self._tokenizer

    def predict(
        self,
        context: PythonModelContext | None,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        """One output row per input row: its ``tokens`` and their ``embeddings`` (nested lists).

        A bad input or param is an MlflowException (INVALID_PARAMETER_VALUE) saying what is wrong.
        """
        with mlflow_errors():
            options = EmbedOptions.from_params(params)
            sentences = self.sentences_of(model_input)
            vectors = self.embed(sentences, options)
        return pd.DataFrame(
            {
                TOKENS_COLUMN: sentences,
                EMBEDDINGS_COLUMN: [None if array is None else array.tolist() for array in vectors],
            }
        )

    def sentences_of(self, frame: pd.DataFrame) -> list[list[str]]:
        """Token lists from the ``tokens`` column, else from tokenizing ``sentence``."""
        return token_lists(frame, TOKENS_COLUMN, SENTENCE_COLUMN, self.tokenizer, self._limits)

    def embed(self, sentences: list[list[str]], options: EmbedOptions) -> list[np.ndarray | None]:
        """Per sentence, the selected layers of its tokens (mean-pooled: None without tokens), in
        input order.

        Sentences are batched by length (less padding); results do not depend on the batching
        because the biLM masks padding and keeps no state between calls.
        """
        weights = self._layer_weights(options)
        order = sorted(range(len(sentences)), key=lambda index: len(sentences[index]))
        vectors: list[np.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), options.batch_size):
            chunk = order[start : start + options.batch_size]
            layers = bilm_layers(self.bilm, [sentences[index] for index in chunk])  # (N, L, T, 2P)
            selected = _select(layers, options, weights)  # (N, L, T, 2P) or (N, T, 2P)
            for row, index in enumerate(chunk):
                real = selected[row, ..., : len(sentences[index]), :]  # (L, T_i, 2P) or (T_i, 2P)
                if options.mean_pool:
                    if not sentences[index]:
                        continue  # no mean: None
                    real = real.mean(dim=-2)  # (L, 2P) or (2P,)
                vectors[index] = real.float().cpu().numpy()
        return vectors

    def _layer_weights(self, options: EmbedOptions) -> torch.Tensor | None:
        """The mix weights ``(L,)`` for ``output="mix"``; checks ``layer`` for ``"layer"``."""
        num_layers = self.bilm.num_layers
        if options.output == "layer" and not -num_layers <= options.layer < num_layers:
            raise ConfigError(
                f"layer {options.layer} out of range for {num_layers} layers", key="params.layer"
            )
        if options.output != "mix":
            return None
        weights = options.weights or (1.0 / num_layers,) * num_layers
        if len(weights) != num_layers:
            raise ConfigError(
                f"{len(weights)} mix weights for {num_layers} layers", key="params.weights"
            )
        return torch.tensor(weights, device=self._device())  # (L,)

    def _device(self) -> torch.device:
        return next(self.bilm.parameters()).device


def _select(
    layers: torch.Tensor, options: EmbedOptions, weights: torch.Tensor | None
) -> torch.Tensor:
    """``layers (N, L, T, 2P)`` → all of them, one layer or their mix ``(N, T, 2P)``."""
    if weights is not None:
        return torch.einsum("l,nltd->ntd", weights, layers)  # (N, T, 2P)
    return layers if options.output == "layers" else layers[:, options.layer]


if __name__ != "pipelines.serving.bilm_pyfunc":
    # MLflow runs this file as the model's code: serve the installed package's class.
    installed = importlib.import_module("pipelines.serving.bilm_pyfunc")
    mlflow.models.set_model(installed.BiLMEmbedder())
