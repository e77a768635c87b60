"""The actor's work run in this process, and the pool sized from the cluster's resources."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.tokenize import WhitespaceTokenizer
from pipelines.embed import workers
from pipelines.embed.embedding_shards import table_vectors
from pipelines.embed.inputs import plan_chunks
from pipelines.embed.vectors import embed_sentences
from pipelines.embed.workers import ChunkEmbedder, EmbedJob, WorkerPool
from pipelines.serving.bilm_loader import resolve_bilm

CPU_POOL = WorkerPool(1, num_cpus=1, num_gpus=0)


@pytest.mark.parametrize(
    ("resources", "concurrency", "expected"),
    [
        ({"CPU": 16.0}, None, WorkerPool(8, 2, 0)),
        ({"CPU": 2.0}, 2, WorkerPool(2, 1, 0)),
        ({"CPU": 2.0}, 4, WorkerPool(4, 0.5, 0)),
        ({"CPU": 16.0, "GPU": 2.0}, None, WorkerPool(2, 1, 1.0)),
        ({"CPU": 16.0, "GPU": 1.0}, 2, WorkerPool(2, 1, 0.5)),
    ],
)
def test_the_pool_has_an_actor_per_gpu_else_per_two_cpus(
    monkeypatch, resources, concurrency, expected
):
    monkeypatch.setattr(workers.ray, "cluster_resources", lambda: resources)

    pool = WorkerPool.for_cluster(concurrency)

    assert pool == expected
    assert pool.use_gpu == (expected.num_gpus > 0)


@pytest.fixture
def job(tmp_path) -> EmbedJob:
    torch.manual_seed(0)
    write_bilm_dir(BiLM(tiny().model_copy(update={"num_samples": 4}), 20), tmp_path / "bilm")
    tokenizer = WhitespaceTokenizer().describe()
    return EmbedJob(
        resolve_bilm(tmp_path / "bilm"), tokenizer, str(tmp_path / "out"), "mix", "float32", 2
    )


def test_a_chunk_is_embedded_and_written_as_its_shard(job, tmp_path):
    (tmp_path / "in.txt").write_text("a b c\n\nd e\nf\n")
    chunk = plan_chunks([tmp_path / "in.txt"], sentences_per_chunk=10).chunks[0]
    embedder = ChunkEmbedder(job, CPU_POOL)

    summary = embedder(pa.Table.from_pylist([vars(chunk)]))

    assert summary["index"].tolist() == [0] and summary["error"].tolist() == [b""]
    assert (summary["num_sentences"].tolist(), summary["num_tokens"].tolist()) == ([3], [6])
    table = pq.read_table(tmp_path / "out" / "part-000000.parquet")
    assert table.column("sentence_id").to_pylist() == [0, 2, 3]
    expected = embed_sentences(embedder.bilm, [["a", "b", "c"], ["d", "e"], ["f"]], "mix", 8)
    for got, want in zip(table_vectors(table, "mix"), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_user_error_in_the_actor_comes_back_as_itself(job, tmp_path):
    (tmp_path / "in.txt").write_text("a\n")
    chunk = plan_chunks([tmp_path / "in.txt"], sentences_per_chunk=10).chunks[0]
    (tmp_path / "bilm" / "model.pt").unlink()

    summary = ChunkEmbedder(job, CPU_POOL)(pa.Table.from_pylist([vars(chunk)]))

    error = pickle.loads(summary["error"][0])
    assert isinstance(error, WeightsError) and "model.pt is missing" in str(error)


def test_a_cpu_actor_takes_its_share_of_threads_fewer_under_load(job, monkeypatch):
    shares: list[int] = []
    monkeypatch.setattr(workers, "threads_under_load", lambda share: shares.append(share) or 1)
    before = torch.get_num_threads()
    try:
        ChunkEmbedder(job, WorkerPool(1, num_cpus=2, num_gpus=0))
        assert shares == [2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
