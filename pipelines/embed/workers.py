"""The distributed part of ``elmo embed``: an actor pool holding the frozen biLM, a shard per chunk.

A chunk's shard is written as soon as it is embedded, so a killed run keeps every finished chunk.
A user error in an actor comes back in its summary and is raised in the driver as itself (Ray Data
would wrap it, its message lost).
"""

from __future__ import annotations

import logging
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import torch

from elmo_core.errors import ElmoError
from elmo_core.model.bilm import BiLM
from elmo_core.text.tokenize import Tokenizer
from elmo_core.threads import threads_under_load
from pipelines.embed.embedding_shards import Dtype, shard_name, vectors_table
from pipelines.embed.inputs import Chunk, read_chunk
from pipelines.embed.output import EmbeddingsDir
from pipelines.embed.vectors import Output, embed_sentences
from pipelines.serving.bilm_loader import BiLMReference, load_bilm

RAY_DATA_LOGGER = "ray.data"


@dataclass(frozen=True)
class EmbedJob:
    """Everything an actor needs, pinned by the driver."""

    bilm: BiLMReference
    tokenizer: dict[str, Any]  # a manifest's tokenizer description
    out: str
    output: Output
    dtype: Dtype
    batch_size: int


@dataclass(frozen=True)
class WorkerPool:
    """How many actors, and what each holds."""

    size: int
    num_cpus: float
    num_gpus: float

    @staticmethod
    def for_cluster(concurrency: int | None) -> WorkerPool:
        """One actor per GPU, or per two CPUs without GPUs, unless ``concurrency`` says."""
        resources = ray.cluster_resources()
        gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 1))
        if gpus >= 1:
            size = concurrency or int(gpus)
            return WorkerPool(size, num_cpus=1, num_gpus=min(1.0, gpus / size))
        size = concurrency or max(1, int(cpus) // 2)
        return WorkerPool(size, num_cpus=cpus / size if size > cpus else cpus // size, num_gpus=0)

    @property
    def use_gpu(self) -> bool:
        return self.num_gpus > 0

    @property
    def threads(self) -> int:
        """Torch's intra-op threads in a CPU actor: its share of the CPUs."""
        return max(1, int(self.num_cpus))


@dataclass(frozen=True)
class ChunkDone:
    """What an actor reports for a chunk whose shard it wrote."""

    index: int
    num_sentences: int
    num_tokens: int


class ChunkEmbedder:
    """Ray Data's callable class: per actor, the biLM and tokenizer; per call, whole chunks."""

    def __init__(self, job: EmbedJob, pool: WorkerPool) -> None:
        self.job, self.pool = job, pool
        self.error: ElmoError | None = None
        try:
            self.bilm = self._load_bilm()
            self.tokenizer = Tokenizer.from_manifest(job.tokenizer)
        except ElmoError as error:  # reported with the first chunk, raised by the driver
            self.error = error
        self.out = EmbeddingsDir(job.out)

    def _load_bilm(self) -> BiLM:
        if self.pool.use_gpu:  # float32 means float32: no TF32 in the convolutions or GEMMs
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        else:  # its share, fewer on a loaded machine (elmo_core.threads)
            torch.set_num_threads(threads_under_load(self.pool.threads))
        scratch = Path(tempfile.mkdtemp(prefix="elmo-embed-"))
        bilm = load_bilm(self.job.bilm, scratch).bilm
        return bilm.to("cuda" if self.pool.use_gpu else "cpu")

    def __call__(self, batch: pa.Table) -> dict[str, np.ndarray]:
        """Embed and write each chunk of ``batch``; one summary row per chunk."""
        chunks = [Chunk(**row) for row in batch.to_pylist()]
        done, errors = [], []
        for chunk in chunks:
            try:
                if self.error is not None:
                    raise self.error
                done.append(self.embed_chunk(chunk))
                errors.append(b"")
            except ElmoError as error:
                done.append(ChunkDone(chunk.index, 0, 0))
                errors.append(pickle.dumps(error))
        return {
            "index": np.array([d.index for d in done], dtype=np.int64),
            "num_sentences": np.array([d.num_sentences for d in done], dtype=np.int64),
            "num_tokens": np.array([d.num_tokens for d in done], dtype=np.int64),
            "error": np.array(errors, dtype=object),
        }

    def embed_chunk(self, chunk: Chunk) -> ChunkDone:
        """Read, tokenize and embed one chunk, and write its shard whole."""
        ids, texts = read_chunk(chunk)
        tokens = [self.tokens_of(text) for text in texts]
        vectors = embed_sentences(self.bilm, tokens, self.job.output, self.job.batch_size)
        table = vectors_table(ids, texts, tokens, vectors, self.job.output, self.job.dtype)
        self.out.write_table(shard_name(chunk.index), table)
        return ChunkDone(chunk.index, len(ids), sum(len(t) for t in tokens))

    def tokens_of(self, text: str) -> list[str]:
        """A line is one sentence: when the tokenizer splits it into several, their tokens are
        concatenated, as the registered biLM's pyfunc model does with a row of text."""
        return [token for sentence in self.tokenizer.tokenize(text) for token in sentence]


def embed_chunks(job: EmbedJob, chunks: Sequence[Chunk], pool: WorkerPool) -> Iterator[ChunkDone]:
    """Run ``chunks`` through the actor pool; yields each as its shard is written (any order)."""
    if not chunks:
        return
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the stage draws one bar over sentences
    context.print_on_execution_start = False
    rows = [asdict(chunk) for chunk in chunks]
    dataset = ray.data.from_items(rows, override_num_blocks=len(rows))
    summaries = dataset.map_batches(
        ChunkEmbedder,
        fn_constructor_kwargs={"job": job, "pool": pool},
        batch_format="pyarrow",
        batch_size=1,  # a chunk is the unit of work; batch_size sentences is the model's batch
        compute=ray.data.ActorPoolStrategy(size=pool.size, max_tasks_in_flight_per_actor=1),
        num_cpus=pool.num_cpus,
        num_gpus=pool.num_gpus,
    )
    logger = logging.getLogger(RAY_DATA_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)  # no "execution finished", "progress bars disabled" lines
    try:
        for row in summaries.iter_rows():
            if row["error"]:
                raise pickle.loads(row["error"])
            yield ChunkDone(int(row["index"]), int(row["num_sentences"]), int(row["num_tokens"]))
    finally:
        logger.setLevel(level)
