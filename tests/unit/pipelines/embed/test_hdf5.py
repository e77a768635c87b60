"""The HDF5 output reads as AllenNLP's ``elmo`` command wrote it."""

from __future__ import annotations

import json

import h5py
import numpy as np

from pipelines.embed.embedding_shards import vectors_table
from pipelines.embed.hdf5 import HDF5_FILE, write_hdf5
from pipelines.embed.output import EmbeddingsDir


def test_one_dataset_per_sentence_id_and_a_json_sentence_index(tmp_path):
    out = EmbeddingsDir(str(tmp_path))
    rng = np.random.default_rng(0)
    first = [rng.standard_normal((3, 2, 4)).astype(np.float32) for _ in range(2)]
    second = [rng.standard_normal((3, 1, 4)).astype(np.float32)]
    out.write_table(
        "part-000000.parquet",
        vectors_table([0, 2], ["a b", "c d"], [["a", "b"], ["c", "d"]], first, "all", "float32"),
    )
    out.write_table(
        "part-000001.parquet",
        vectors_table([3], ["a b"], [["e"]], second, "all", "float32"),
    )

    location = write_hdf5(out, ["part-000000.parquet", "part-000001.parquet"], "all", 3)

    assert location == str(tmp_path / HDF5_FILE)
    with h5py.File(location, "r") as hdf5:
        assert sorted(hdf5.keys()) == ["0", "2", "3", "sentence_to_index"]
        np.testing.assert_array_equal(hdf5["2"][...], first[1])
        assert hdf5["3"].shape == (3, 1, 4) and hdf5["3"].dtype == np.float32
        index = hdf5["sentence_to_index"]
        assert index.shape == (1,)
        # a repeated sentence maps to its last index, as AllenNLP's dict did
        assert json.loads(index[0]) == {"a b": "3", "c d": "2"}


def test_float16_mean_vectors_keep_their_dtype_and_shape(tmp_path):
    out = EmbeddingsDir(str(tmp_path))
    vectors = [np.ones(4, dtype=np.float32), np.zeros(4, dtype=np.float32)]
    table = vectors_table([5, 6], ["x", "y"], [["x"], ["y"]], vectors, "mean", "float16")
    out.write_table("part-000000.parquet", table)

    with h5py.File(write_hdf5(out, ["part-000000.parquet"], "mean", 2), "r") as hdf5:
        assert hdf5["5"].shape == (4,) and hdf5["5"].dtype == np.float16
        assert hdf5["5"][0] == 1.0
