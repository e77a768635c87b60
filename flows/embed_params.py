"""The typed parameters of the ``embed`` flow, in the style of :mod:`flows.params`.

The choices are the stage's own types, so the deployment's schema lists them as enums and the
server refuses ``output: "layers"`` before a run starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import Field

from flows.params import DEFAULT_BILM, Params
from pipelines.common.settings import elmo_home
from pipelines.embed.embedding_shards import Dtype
from pipelines.embed.stage import DEFAULT_BATCH_SIZE, DEFAULT_SENTENCES_PER_SHARD, Format
from pipelines.embed.vectors import Output


class EmbedParams(Params):
    """A text → ELMo vectors per sentence, with a registered (or local) biLM."""

    input: str = Field(
        description="one sentence per line: a file, directory, glob, URL or 'python-docs'"
    )
    bilm: str = Field(DEFAULT_BILM, description="models:/ URI, model/run directory or HDF5")
    bilm_options: str | None = Field(None, description="options.json of an HDF5 biLM")
    out: str | None = Field(None, description="output dir or URL; default ELMO_HOME/embeddings/...")
    output: Output = Field("all", description="all layers, top layer, mix (layer average), mean")
    format: Format = Field("parquet", description="parquet shards, or one HDF5 file (AllenNLP)")
    dtype: Dtype = "float32"
    batch_size: int = Field(DEFAULT_BATCH_SIZE, gt=0, description="sentences per forward pass")
    concurrency: int | None = Field(None, gt=0, description="actors; default one per GPU")
    sentences_per_shard: int = Field(DEFAULT_SENTENCES_PER_SHARD, gt=0)
    tokenized: bool = Field(False, description="lines are whitespace-tokenized")
    manifest: str | None = Field(None, description="dataset manifest.json naming the tokenizer")

    def out_dir(self) -> str:
        """``out``, or a directory under ``ELMO_HOME/embeddings`` named by the input and a digest
        of what makes the vectors, so another biLM or output never lands in the same place."""
        if self.out is not None:
            return self.out
        identity = self.model_dump(
            include={"input", "bilm", "bilm_options", "output", "format", "dtype", "tokenized"}
        )
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(self.input.rstrip("/")).name).strip("-")
        return str(elmo_home() / "embeddings" / f"{stem or 'input'}-{digest}")
