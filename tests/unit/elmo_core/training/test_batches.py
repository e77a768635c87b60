"""Batches built ahead by loader processes are the streams' own windows, and resume exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_core.data.batching import window_char_ids
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.errors import DataError
from elmo_core.training.batches import CandidateSpec, StepBatches, StreamSpec

ROWS, UNROLL, STEPS = 3, 4, 12
SENTENCES = [f"sentence {i} has {'some ' * (i % 5)}words" for i in range(40)]


@pytest.fixture
def dataset(make_dataset) -> str:
    return make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)


def _specs(dataset: str) -> tuple[StreamSpec, StreamSpec]:
    forward, backward = (
        StreamSpec(dataset, ROWS, UNROLL, rank=0, world_size=1, reverse=reverse, seed=seed)
        for reverse, seed in ((False, 11), (True, 12))
    )
    return forward, backward


def _batches(dataset: str, specs, workers: int) -> StepBatches:
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    return StepBatches(specs, manifest, table, workers=workers, pin_memory=False)


def _expected(dataset: str) -> list[tuple[np.ndarray, ...]]:
    """Both streams read in the training loop itself, window by window."""
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    streams = [spec.open(manifest) for spec in _specs(dataset)]
    steps = []
    for _ in range(STEPS):
        windows = [stream.next_window() for stream in streams]
        steps.append(
            tuple(
                array
                for window in windows
                for array in (window_char_ids(window.inputs, table), window.targets)
            )
        )
    return steps


def _arrays(batch) -> tuple[np.ndarray, ...]:
    arguments = batch.step_arguments(torch.device("cpu"))
    names = ("forward_inputs", "forward_targets", "backward_inputs", "backward_targets")
    return tuple(arguments[name].numpy() for name in names)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_loader_processes_give_the_streams_windows_in_order(dataset, workers) -> None:
    with _batches(dataset, _specs(dataset), workers) as batches:
        got = [_arrays(next(batches)) for _ in range(STEPS)]
    for step, (ours, expected) in enumerate(zip(got, _expected(dataset), strict=True)):
        for a, b in zip(ours, expected, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_continuing_from_a_consumed_batch_reads_what_came_next(dataset) -> None:
    specs = _specs(dataset)
    with _batches(dataset, specs, 2) as batches:  # two processes, each several windows ahead
        consumed = [next(batches) for _ in range(5)]
    last = consumed[-1]
    resumed = (
        specs[0].starting_at(last.forward.position.state_dict()),
        specs[1].starting_at(last.backward.position.state_dict()),
    )
    with _batches(dataset, resumed, 2) as batches:
        got = [_arrays(next(batches)) for _ in range(STEPS - 5)]
    for ours, expected in zip(got, _expected(dataset)[5:], strict=True):
        for a, b in zip(ours, expected, strict=True):
            np.testing.assert_array_equal(a, b)


def test_candidates_come_with_each_window_and_resume_with_its_stream(dataset) -> None:
    draw = CandidateSpec(vocab_size=load_manifest(dataset).vocab.size, num_samples=5)
    specs = tuple(replace(spec, candidates=draw) for spec in _specs(dataset))
    with _batches(dataset, specs, 2) as batches:
        straight = [next(batches) for _ in range(8)]
    last = straight[4]
    resumed_specs = (
        specs[0].starting_at(last.forward.position.state_dict()),
        specs[1].starting_at(last.backward.position.state_dict()),
    )
    with _batches(dataset, resumed_specs, 2) as batches:
        resumed = [next(batches) for _ in range(3)]

    def ids(batch) -> list[list[int]]:
        return [candidates.ids.tolist() for candidates in batch.candidates()]

    assert all(len(set(sets[0])) == 5 for sets in map(ids, straight))
    assert ids(straight[0])[0] != ids(straight[0])[1]  # each direction draws its own
    assert ids(straight[0]) != ids(straight[1])  # and a new set for each window
    assert [ids(batch) for batch in resumed] == [ids(batch) for batch in straight[5:]]


def test_a_steps_token_types_cover_both_windows(dataset) -> None:
    with _batches(dataset, _specs(dataset), 2) as batches:
        batch = next(batches)
    char_ids, inverse, _ = batch.types
    assert inverse.shape == (2, ROWS, UNROLL)
    assert len(char_ids) < inverse.numel()  # repeated words are encoded once a window
    # the char ids gathered from them are checked against the streams' own in
    # test_loader_processes_give_the_streams_windows_in_order


def test_a_steps_softmax_rows_are_both_windows_targets_and_candidates(dataset) -> None:
    draw = CandidateSpec(vocab_size=load_manifest(dataset).vocab.size, num_samples=5)
    specs = tuple(replace(spec, candidates=draw) for spec in _specs(dataset))
    with _batches(dataset, specs, 2) as batches:
        batch = next(batches)
    assert batch.softmax_rows is not None
    expected = set(batch.forward.targets.clamp(min=0).flatten().tolist())
    expected |= set(batch.backward.targets.clamp(min=0).flatten().tolist())
    for candidates in batch.candidates() or ():
        expected |= set(candidates.ids.tolist())
    assert batch.softmax_rows.tolist() == sorted(expected)


def test_without_a_candidate_spec_the_softmax_draws_them(dataset) -> None:
    with _batches(dataset, _specs(dataset), 0) as batches:
        batch = next(batches)
    assert batch.candidates() is None and batch.softmax_rows is None


def test_iterating_leaves_the_global_torch_rng_alone(dataset) -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with _batches(dataset, _specs(dataset), 2) as batches:
        next(batches)
    assert torch.equal(torch.rand(3), expected)


def test_a_data_error_in_a_loader_process_arrives_as_itself(dataset) -> None:
    shard = sorted((Path(dataset) / "train").glob("*.parquet"))[0]
    shard.unlink()
    with (
        pytest.raises(DataError, match="re-run prepare") as caught,
        _batches(dataset, _specs(dataset), 2) as batches,
    ):
        next(batches)
    assert caught.value.path is not None and shard.name in caught.value.path


def test_more_than_one_process_per_direction_is_refused(dataset) -> None:
    with pytest.raises(ValueError, match="one per direction"):
        _batches(dataset, _specs(dataset), 3)
