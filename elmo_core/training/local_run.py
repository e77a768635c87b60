"""Training steps in one process, without Ray: a worker's data path and step, for a notebook, a
benchmark or a test that wants to train a biLM for a while and watch its losses."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.threads import fewer_threads_under_load
from elmo_core.training.loop import carried_steps, step_batches, training_streams
from elmo_core.training.step import StepResult, TrainingStep

STREAM_SEEDS = (1, 2)  # forward, backward


def step_results(
    step: TrainingStep, dataset_url: str, device: torch.device, *, workers: int = 0
) -> Iterator[StepResult]:
    """``step`` on the dataset's training streams, one result per step, for as long as it is
    iterated: windows, token types, candidates and softmax rows built by ``workers`` loader
    processes (0: in this one), each LSTM state carried into the next step, with fewer torch
    threads while the machine is oversubscribed. Closing the iterator stops the loader."""
    manifest = load_manifest(dataset_url)
    table = load_word_types(dataset_url, manifest).char_ids
    streams = training_streams(step, dataset_url, manifest, STREAM_SEEDS)
    with (
        fewer_threads_under_load(),
        step_batches(step, streams, manifest, table, device, workers=workers) as batches,
    ):
        for _, result in carried_steps(step, batches, device):
            yield result
