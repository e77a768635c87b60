"""A lost node, simulated: training across Ray nodes survives losing one of them.

A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head that runs
no workers and two one-CPU nodes, so the two training workers sit on different nodes), with the
dataset and the run directory on a local S3 server (moto). Once the run has committed a
checkpoint, one worker node is removed and a fresh node joins, as an autoscaler would replace it
(the driver trains in a thread meanwhile, as ``train`` runs in a flow's task): the driver
restarts the workers, they resume from the newest checkpoint on S3, and the final model equals
that of a run on the same cluster that was never interrupted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import s3fs
import torch

from elmo_core.config import PrepareConfig
from elmo_core.model.serialization import MODEL_DIR, read_bilm_dir
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files
from pipelines.train.job_config import resolve_train_config
from pipelines.train.run_directory import RunDirectory
from pipelines.train.stage import train

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]  # 392 s on the slow machine

NODE_MEMORY = 80 * 1024**2  # object store per node: the workers pass nothing large


@pytest.fixture
def cluster(s3_endpoint: str, without_session_ray: None) -> Iterator[tuple[object, list[object]]]:
    """Head (no CPUs: the driver and Train's controller only) + two one-CPU worker nodes."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": NODE_MEMORY,
        },
    )
    workers = [cluster.add_node(num_cpus=1, object_store_memory=NODE_MEMORY) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


def _dataset_on_s3(tmp_path: Path) -> str:
    rng = random.Random(2)
    words = [f"w{i}" for i in range(150)]
    for split, count in (("train", 300), ("heldout", 30)):
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(count)]
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    corpus = CorpusFiles(
        str(tmp_path), "text", [tmp_path / "train.txt"], [tmp_path / "heldout.txt"]
    )
    cfg = PrepareConfig(format="text", sentences_per_shard=100, sentences_per_row_group=25)
    prepare_files(cfg, corpus, "s3://datasets/lost-node")
    return "s3://datasets/lost-node"


def _config(name: str):
    return resolve_train_config(
        "tiny",
        None,
        [
            "train.batch_size=4",
            "train.unroll_steps=5",
            "train.max_steps=30",
            "train.checkpoint_every=5",
            "train.validate_every=30",
            "train.validation_sentences=10",
            "run.num_workers=2",
            "run.max_failures=2",
            f"run.name={name}",
            "run.storage_path=s3://datasets/runs",
        ],
    )


def _newest_committed_step(fs: s3fs.S3FileSystem, run_dir: str) -> int | None:
    fs.invalidate_cache()
    committed = fs.glob(f"{run_dir.removeprefix('s3://')}/checkpoints/*/COMPLETE")
    return max((int(path.split("/")[-2][5:]) for path in committed), default=None)


def _lose_a_node_once_checkpointed(cluster, node, run_dir: str, training: Future) -> int | None:
    """Wait for the run's first committed checkpoint, then remove ``node`` and add a fresh one
    (here, in the main thread: Ray starts a node's processes with signal handlers); the newest
    checkpoint committed at that moment, or None if the run ended first."""
    fs = s3fs.S3FileSystem()
    while not training.done():
        step = _newest_committed_step(fs, run_dir)
        if step is not None:
            cluster.remove_node(node)
            cluster.add_node(num_cpus=1, object_store_memory=NODE_MEMORY)
            return step
        time.sleep(0.1)
    return None


def _final_weights(run_dir: str, local: Path) -> dict[str, torch.Tensor]:
    return read_bilm_dir(str(RunDirectory(run_dir).get(MODEL_DIR, local))).state_dict()


def test_a_run_survives_losing_a_worker_node(cluster, store, tmp_path) -> None:
    ray_cluster, (_, doomed) = cluster
    data = _dataset_on_s3(tmp_path)

    straight = train(_config("straight"), data)
    assert straight.resumed_from_step == 0

    with ThreadPoolExecutor(max_workers=1) as driver:
        training = driver.submit(train, _config("lost"), data)
        committed = _lose_a_node_once_checkpointed(
            ray_cluster, doomed, "s3://datasets/runs/lost", training
        )
        survived = training.result()

    assert committed is not None, "the run ended before a node was lost"
    assert survived.steps == survived.total_steps == straight.steps
    assert 0 < committed <= survived.resumed_from_step < survived.steps
    assert store.get_run(survived.mlflow_run_id).info.status == "FINISHED"
    expected = _final_weights(straight.run_dir, tmp_path / "straight")
    for name, tensor in _final_weights(survived.run_dir, tmp_path / "survived").items():
        assert torch.equal(tensor, expected[name]), name
