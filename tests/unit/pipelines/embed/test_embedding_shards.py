"""Shards: vectors go in as nested fixed-size lists and come back as the same arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.embed.embedding_shards import shard_name, table_vectors, vectors_table

LENGTHS = [3, 1, 0, 4]
SHAPES = {
    "all": lambda t: (3, t, 8),
    "top": lambda t: (t, 8),
    "mix": lambda t: (t, 8),
    "mean": lambda t: (8,),
}


def _vectors(output: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(SHAPES[output](t)).astype(np.float32) for t in LENGTHS]


def _round_trip(table: pa.Table, tmp_path) -> pa.Table:
    pq.write_table(table, tmp_path / "shard.parquet")
    return pq.read_table(tmp_path / "shard.parquet")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("output", ["all", "top", "mix", "mean"])
def test_vectors_survive_a_parquet_round_trip_in_their_dtype(output, dtype, tmp_path):
    vectors = _vectors(output)
    tokens = [[f"t{i}" for i in range(t)] for t in LENGTHS]
    texts = [" ".join(row) for row in tokens]
    table = vectors_table([0, 2, 3, 7], texts, tokens, vectors, output, dtype)

    back = _round_trip(table, tmp_path)

    assert back.column("sentence_id").to_pylist() == [0, 2, 3, 7]
    assert back.column("tokens").to_pylist() == tokens
    assert back.column("text").to_pylist() == texts
    for expected, got in zip(vectors, table_vectors(back, output), strict=True):
        assert got.dtype == np.dtype(dtype) and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected.astype(dtype))


def test_all_layers_are_nested_layers_then_tokens_then_fixed_size_vectors():
    tokens = [["a", "b", "c"], ["d"], [], ["e", "f", "g", "h"]]
    vectors = _vectors("all")
    table = vectors_table([0, 1, 2, 3], ["", "", "", ""], tokens, vectors, "all", "float32")

    kind = table.schema.field("vectors").type
    assert kind == pa.list_(pa.list_(pa.list_(pa.float32(), 8)), 3)
    assert table.column("vectors").to_pylist()[1][2][0] == pytest.approx(vectors[1][2, 0].tolist())


def test_shard_names_sort_in_chunk_order():
    names = [shard_name(index) for index in (10, 2, 100_000, 0)]

    assert sorted(names) == [shard_name(i) for i in (0, 2, 10, 100_000)]
    assert shard_name(12) == "part-000012.parquet"
