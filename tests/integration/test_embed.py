"""``elmo embed`` on a real local Ray: vectors equal direct biLM calls whatever the batching, the
HDF5 file reads as AllenNLP's, a lost shard is all a re-run writes, bad input fails clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from elmo_core.data.reader import load_manifest
from elmo_core.errors import WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import CONFIG_FILE, read_bilm_dir, write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.text.char_ids import batch_to_ids
from elmo_core.text.tokenize import MosesTokenizer
from pipelines.embed.cli import main
from pipelines.embed.embedding_shards import table_vectors
from pipelines.embed.stage import EmbedResult, embed
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

LINES = [f"w{i % 7} the " + " ".join(["x"] * (i % 5)) + f" end{i}" for i in range(11)]
LINES[3] = ""  # an empty line: skipped, counted, its id left out
LINES[8] = "   "


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("embed")
    (root / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    write_bilm_dir(BiLM(tiny().model_copy(update={"num_samples": 4}), 20), root / "bilm")
    return root


# Two embedding actors for the first run (the work dealt between them), one for the others: each
# actor is a process that loads torch and the biLM.
def _embed(workspace: Path, out: str, **options) -> EmbedResult:
    options = {"tokenized": True, "sentences_per_shard": 4, "concurrency": 1, **options}
    return embed(
        str(workspace / "bilm"), str(workspace / "in.txt"), str(workspace / out), **options
    )


def _shards(out: Path, output: str = "all") -> dict[int, tuple[list[str], np.ndarray]]:
    rows = {}
    for path in sorted(out.glob("part-*.parquet")):
        table = pq.read_table(path)
        ids, tokens = table.column("sentence_id").to_pylist(), table.column("tokens").to_pylist()
        rows |= dict(zip(ids, zip(tokens, table_vectors(table, output), strict=True), strict=True))
    return rows


def _alone(workspace: Path, tokens: list[str]) -> np.ndarray:
    """Every layer of one sentence, the biLM called directly on a batch of one: (L, T, 2P)."""
    bilm = read_bilm_dir(workspace / "bilm").eval()
    with torch.no_grad():
        output = bilm(batch_to_ids([tokens]))
    return torch.stack([layer[0, 1:-1] for layer in output.activations]).numpy()


@pytest.fixture(scope="module")
def first_run(store, ray_session, workspace) -> EmbedResult:
    return _embed(workspace, "all-1", batch_size=1, concurrency=2)


def test_vectors_equal_the_biLM_called_directly_whatever_the_batch_size(
    store, ray_session, workspace, first_run
):
    second = _embed(workspace, "all-5", batch_size=5)

    expected_ids = [i for i, line in enumerate(LINES) if line.strip()]
    for result in (first_run, second):
        rows = _shards(Path(result.out))
        assert sorted(rows) == expected_ids
        for sentence_id, (tokens, vectors) in rows.items():
            assert tokens == LINES[sentence_id].split()
            assert vectors.dtype == np.float32
            np.testing.assert_allclose(vectors, _alone(workspace, tokens), atol=1e-5)
    assert (first_run.num_sentences, first_run.num_empty_lines) == (9, 2)
    assert (first_run.shards_written, first_run.shards_skipped) == (3, 0)
    assert first_run.num_tokens == sum(len(line.split()) for line in LINES)


def test_the_run_records_input_model_output_and_counts(store, first_run, workspace):
    run = store.get_run(first_run.run_id)

    assert run.data.tags[stage_runs.STAGE_TAG] == "embed"
    assert run.data.tags["elmo.bilm_path"] == str(workspace / "bilm")
    params = run.data.params
    assert params["input"] == str(workspace / "in.txt") and params["out"] == first_run.out
    assert params["bilm"] == str(workspace / "bilm") and params["input_files"] == "1"
    assert (params["output"], params["dtype"], params["tokenizer.name"]) == (
        "all",
        "float32",
        "whitespace",
    )
    assert (params["concurrency"], params["device"]) == ("2", "cpu")
    metrics = run.data.metrics
    assert (metrics["sentences"], metrics["empty_lines"], metrics["shards_written"]) == (9, 2, 3)
    assert metrics["tokens_embedded"] == first_run.num_tokens
    # the rate is over the embedding's own time, a part of the run's
    assert metrics["sentences_embedded"] == 9
    assert metrics["sentences_per_second"] >= metrics["sentences_embedded"] / metrics["seconds"]


def test_hdf5_output_reads_back_in_allennlps_layout(store, ray_session, workspace, first_run):
    result = _embed(workspace, "hdf5", format="hdf5", batch_size=3)

    (location,) = result.files
    assert sorted(p.name for p in Path(result.out).iterdir()) == ["embed.json", "embeddings.hdf5"]
    expected = _shards(Path(first_run.out))
    with h5py.File(location, "r") as hdf5:
        index = json.loads(hdf5["sentence_to_index"][0])
        assert index == {LINES[i].strip(): str(i) for i in expected}
        assert sorted(hdf5) == sorted([*index.values(), "sentence_to_index"])
        for sentence_id, (tokens, vectors) in expected.items():
            stored = hdf5[str(sentence_id)][...]
            assert stored.shape == (3, len(tokens), 32)
            np.testing.assert_allclose(stored, vectors, atol=1e-5)


def test_a_rerun_writes_only_the_shard_a_killed_run_left_missing(
    store, ray_session, workspace, first_run, capsys
):
    out, first_run_out = workspace / "resumed", Path(first_run.out)
    shutil.copytree(first_run_out, out)
    (out / "part-000001.parquet").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    args = ["--bilm", str(workspace / "bilm"), "--input", str(workspace / "in.txt")]

    options = ["--tokenized", "--sentences-per-shard", "4", "--concurrency", "1"]
    status = main([*args, "--out", str(out), *options])

    assert status == 0
    assert "embedded 4 of 9 sentences" in capsys.readouterr().out
    assert {
        p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet") if p.name in kept
    } == kept
    rewritten, original = (pq.read_table(d / "part-000001.parquet") for d in (out, first_run_out))
    assert rewritten.drop_columns("vectors").equals(original.drop_columns("vectors"))
    for got, expected in zip(
        *(table_vectors(t, "all") for t in (rewritten, original)), strict=True
    ):
        np.testing.assert_allclose(got, expected, atol=1e-6)  # the actors' threads may differ


def test_raw_text_is_tokenized_as_the_datasets_manifest_says(
    store, ray_session, make_dataset, tmp_path
):
    dataset = make_dataset(["The cat sat .", "A dog ran ."])
    torch.manual_seed(1)
    bilm = BiLM(tiny().model_copy(update={"num_samples": 4}), load_manifest(dataset).vocab.size)
    write_bilm_dir(bilm, tmp_path / "bilm")
    text = ["Mr. Smith's cat didn't sit.", "", "It rained (heavily), then stopped!"]
    (tmp_path / "raw.txt").write_text("\n".join(text) + "\n", encoding="utf-8")

    result = embed(
        str(tmp_path / "bilm"),
        str(tmp_path / "raw.txt"),
        str(tmp_path / "out"),
        manifest=dataset,
        output="top",
        dtype="float16",
        concurrency=1,
    )

    rows = _shards(Path(result.out), "top")
    moses = MosesTokenizer()
    for sentence_id in (0, 2):
        tokens, vectors = rows[sentence_id]
        assert tokens == [t for s in moses.tokenize(text[sentence_id]) for t in s]
        assert vectors.dtype == np.float16
        expected = _alone(tmp_path, tokens)[-1]
        np.testing.assert_allclose(vectors.astype(np.float32), expected, atol=2e-2, rtol=1e-2)


def test_a_registered_model_that_does_not_exist_is_named(store, workspace, capsys):
    args = ["--bilm", "models:/elmo-bilm/99", "--input", str(workspace / "in.txt")]

    assert main([*args, "--out", str(workspace / "none"), "--tokenized"]) == 2

    assert (
        "error: models:/elmo-bilm/99: no such registered model version" in capsys.readouterr().err
    )


def test_weights_that_do_not_load_in_the_actors_fail_with_the_loaders_error(
    store, ray_session, workspace
):
    broken = workspace / "broken"
    shutil.copytree(workspace / "bilm", broken)
    description = json.loads((broken / CONFIG_FILE).read_text())
    description["model"]["lstm"]["projection_dim"] = 8  # the weights are of 16
    (broken / CONFIG_FILE).write_text(json.dumps(description))

    with pytest.raises(WeightsError, match="weights do not match model_config.json"):
        embed(
            str(broken),
            str(workspace / "in.txt"),
            str(workspace / "out-broken"),
            tokenized=True,
            concurrency=1,
        )
