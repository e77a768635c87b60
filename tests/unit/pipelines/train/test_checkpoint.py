"""Checkpoints restore everything a step depends on; start weights."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.config import LSTMConfig
from elmo_core.data.batching import TokenStream
from elmo_core.errors import ConfigError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.model.serialization import LATEST_FILE, find_model_dir, read_bilm_dir, write_bilm_dir
from elmo_core.presets import tiny
from pipelines.serving.bilm_loader import initial_bilm, resolve_bilm
from pipelines.train.checkpoint import (
    TRAINER_FILE,
    CheckpointStore,
    RankState,
    SharedState,
    StoredCheckpoint,
    capture_rng,
    read_checkpoint,
    restore_rng,
    write_checkpoint,
)
from pipelines.train.run_directory import RunDirectory

CORPUS = [f"w{i % 11} w{i % 7} w{i % 3} end" for i in range(60)]
VOCAB = 100  # above the tiny preset's 64 sampled candidates


@pytest.fixture
def dataset(make_dataset) -> str:
    return make_dataset(CORPUS, {"held.txt": CORPUS[:5]})


def _trained_state(dataset: str) -> tuple[BiLM, torch.optim.Optimizer, list[TokenStream]]:
    torch.manual_seed(0)
    bilm = BiLM(tiny(), VOCAB)
    optimizer = torch.optim.Adagrad(bilm.parameters(), lr=0.2, initial_accumulator_value=1.0)
    sum(p.sum() for p in bilm.parameters()).backward()
    optimizer.step()
    streams = [
        TokenStream(dataset, batch_size=3, unroll_steps=4, reverse=reverse, seed=seed)
        for reverse, seed in ((False, 1), (True, 2))
    ]
    for stream in streams:
        stream.next_window()
    return bilm, optimizer, streams


def _lstm_state() -> tuple[LSTMState, LSTMState]:
    return (
        LSTMState(torch.randn(2, 3, 16), torch.randn(2, 3, 32)),
        LSTMState(torch.randn(2, 3, 16), torch.randn(2, 3, 32)),
    )


def test_a_checkpoint_restores_weights_optimiser_counters_streams_states_and_rng(
    dataset: str, tmp_path: Path
) -> None:
    bilm, optimizer, streams = _trained_state(dataset)
    lstm = _lstm_state()
    curves = {"val/perplexity": [(10, 50.0), (20, 40.0)]}
    shared = SharedState(
        step=20,
        world_size=2,
        mlflow_run_id="abc",
        best_perplexity=40.0,
        best_step=10,
        curves=curves,
    )
    for rank in (0, 1):
        rank_state = RankState(
            capture_rng(), streams[0].state_dict(), streams[1].state_dict(), lstm
        )
        write_checkpoint(
            tmp_path, rank, bilm=bilm, optimizer=optimizer, shared=shared, rank_state=rank_state
        )
    expected_draws = (torch.rand(3), np.random.rand(3), random.random())
    expected_windows = [stream.next_window() for stream in streams]

    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    loaded = read_checkpoint(tmp_path, 1, 2, torch.device("cpu"))
    assert loaded.shared == shared
    assert loaded.rank is not None
    restore_rng(loaded.rank.rng)
    torch.testing.assert_close(torch.rand(3), expected_draws[0])
    np.testing.assert_array_equal(np.random.rand(3), expected_draws[1])
    assert random.random() == expected_draws[2]
    for saved, restored in zip(lstm, loaded.rank.lstm_state or (), strict=True):
        torch.testing.assert_close(restored.h, saved.h)
        torch.testing.assert_close(restored.c, saved.c)
    for reverse, seed, state, expected in zip(
        (False, True),
        (1, 2),
        (loaded.rank.forward_stream, loaded.rank.backward_stream),
        expected_windows,
        strict=True,
    ):
        stream = TokenStream(dataset, batch_size=3, unroll_steps=4, reverse=reverse, seed=seed)
        stream.load_state_dict(state)
        window = stream.next_window()
        assert window is not None and expected is not None
        np.testing.assert_array_equal(window.inputs, expected.inputs)
    restored = read_bilm_dir(loaded.model_dir)
    for name, tensor in bilm.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], tensor)
    fresh = torch.optim.Adagrad(restored.parameters(), lr=0.2)
    fresh.load_state_dict(loaded.optimizer)
    torch.testing.assert_close(
        fresh.state_dict()["state"][0]["sum"], optimizer.state_dict()["state"][0]["sum"]
    )


def test_with_another_world_size_the_rank_part_is_not_restored(
    dataset: str, tmp_path: Path
) -> None:
    bilm, optimizer, streams = _trained_state(dataset)
    rank_state = RankState(capture_rng(), streams[0].state_dict(), streams[1].state_dict(), None)
    write_checkpoint(
        tmp_path,
        0,
        bilm=bilm,
        optimizer=optimizer,
        shared=SharedState(step=5, world_size=1),
        rank_state=rank_state,
    )
    assert read_checkpoint(tmp_path, 0, 1, torch.device("cpu")).rank is not None
    resized = read_checkpoint(tmp_path, 0, 2, torch.device("cpu"))
    assert resized.rank is None and resized.shared.step == 5


def test_a_checkpoint_from_before_the_best_step_was_kept_reads_without_one(
    dataset: str, tmp_path: Path
) -> None:
    bilm, optimizer, streams = _trained_state(dataset)
    rank_state = RankState(capture_rng(), streams[0].state_dict(), streams[1].state_dict(), None)
    shared = SharedState(step=5, world_size=1, best_perplexity=40.0, best_step=5)
    write_checkpoint(
        tmp_path, 0, bilm=bilm, optimizer=optimizer, shared=shared, rank_state=rank_state
    )
    trainer = torch.load(tmp_path / TRAINER_FILE, weights_only=True)
    del trainer["shared"]["best_step"]  # as older runs wrote it
    torch.save(trainer, tmp_path / TRAINER_FILE)

    loaded = read_checkpoint(tmp_path, 0, 1, torch.device("cpu"))

    assert (loaded.shared.best_perplexity, loaded.shared.best_step) == (40.0, None)


def test_start_weights_come_from_a_model_or_checkpoint_directory(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = BiLM(tiny(), VOCAB)
    write_bilm_dir(source, tmp_path / "ckpt" / "model")
    for start in (tmp_path / "ckpt" / "model", tmp_path / "ckpt"):
        torch.manual_seed(2)
        started = initial_bilm(tiny(), VOCAB, resolve_bilm(start))
        for name, tensor in source.state_dict().items():
            torch.testing.assert_close(started.state_dict()[name], tensor)


def test_a_new_vocabulary_size_keeps_the_encoder_and_lstms_but_not_the_softmax(
    tmp_path: Path,
) -> None:
    torch.manual_seed(1)
    source = BiLM(tiny(), VOCAB)
    write_bilm_dir(source, tmp_path / "model")
    started = initial_bilm(tiny(), VOCAB + 30, resolve_bilm(tmp_path / "model"))
    assert started.softmax is not None and started.softmax.weight.shape[0] == VOCAB + 30
    torch.testing.assert_close(started.forward_lstm.state_dict(), source.forward_lstm.state_dict())
    torch.testing.assert_close(
        started.token_encoder.state_dict(), source.token_encoder.state_dict()
    )


def test_weights_of_another_shape_are_a_weights_error(tmp_path: Path) -> None:
    write_bilm_dir(BiLM(tiny(), VOCAB), tmp_path / "model")
    wider = tiny().model_copy(update={"lstm": LSTMConfig(cell_dim=48, projection_dim=16)})
    with pytest.raises(WeightsError, match="do not fit"):
        initial_bilm(wider, VOCAB, resolve_bilm(tmp_path / "model"))


def test_a_bilm_tf_weight_file_needs_its_options_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_bilm(tmp_path / "weights.hdf5", None, options_key="init_options")
    assert raised.value.key == "init_options"


# --- the checkpoint store: only committed checkpoints count, the newest is found whatever is on
# disk, and pruning keeps the newest `keep` and nothing half-written; locally and on an object
# store (fsspec's memory filesystem).


def _part(root: Path, rank: int) -> Path:
    """A rank's part as write_checkpoint lays it out (contents do not matter here)."""
    part = root / f"part-{rank}"
    (part / "model").mkdir(parents=True)
    (part / "model" / "model_config.json").write_text("{}")
    (part / f"rank_{rank}.pt").write_bytes(b"rank")
    if rank == 0:
        (part / "trainer.pt").write_bytes(b"trainer")
    return part


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path: Path) -> CheckpointStore:
    url = str(tmp_path / "run") if request.param == "local" else f"memory://{tmp_path.name}/run"
    return CheckpointStore(RunDirectory(url))


def _save(store: CheckpointStore, tmp_path: Path, step: int, ranks: int = 2) -> None:
    for rank in range(ranks):
        store.save_part(step, _part(tmp_path / f"step-{step}", rank))


def test_a_checkpoint_counts_only_once_committed(store, tmp_path) -> None:
    assert store.newest() is None
    _save(store, tmp_path, 10)
    assert store.newest() is None  # every part is there, but rank 0 has not committed it
    store.commit(10, world_size=2, keep=2)
    assert store.newest() == StoredCheckpoint(10)
    assert store.run_dir.read_json("checkpoints/step_000010/COMPLETE") == {
        "step": 10,
        "world_size": 2,
    }


def test_the_newest_complete_checkpoint_wins_over_older_and_half_written_ones(
    store, tmp_path
) -> None:
    for step in (10, 20, 30):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=3)
    _save(store, tmp_path, 40, ranks=1)  # killed while saving step 40
    assert [c.step for c in store.complete()] == [10, 20, 30]
    assert store.newest() == StoredCheckpoint(30)
    assert store.remove_incomplete() == [StoredCheckpoint(40)]
    assert [c.step for c in store.complete()] == [10, 20, 30]
    assert store.run_dir.subdirectories("checkpoints") == [
        "step_000010",
        "step_000020",
        "step_000030",
    ]


def test_commit_prunes_to_keep_and_removes_orphans(store, tmp_path) -> None:
    _save(store, tmp_path, 5, ranks=1)  # an orphan a crashed attempt left
    for step in (10, 20, 30):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=2)
    assert store.run_dir.subdirectories("checkpoints") == ["step_000020", "step_000030"]


def test_a_rank_reads_its_part_and_the_shared_files(store, tmp_path) -> None:
    _save(store, tmp_path, 10)
    store.commit(10, world_size=2, keep=2)
    with store.opened(StoredCheckpoint(10), rank=1) as directory:
        assert (directory / "rank_1.pt").read_bytes() == b"rank"
        assert (directory / "trainer.pt").read_bytes() == b"trainer"
        assert (directory / "model" / "model_config.json").is_file()


def test_latest_points_evaluate_at_the_newest_checkpoint(tmp_path) -> None:
    store = CheckpointStore(RunDirectory(str(tmp_path / "run")))
    for step in (10, 20):
        _save(store, tmp_path, step)
        store.commit(step, world_size=2, keep=2)
    assert (tmp_path / "run" / LATEST_FILE).read_text().strip() == "checkpoints/step_000020"
    assert find_model_dir(tmp_path / "run") == tmp_path / "run/checkpoints/step_000020/model"
