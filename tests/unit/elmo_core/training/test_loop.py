"""The loop core: each step starts from the LSTM state the previous one left (truncated BPTT)."""

from __future__ import annotations

import itertools

import torch

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training.loop import carried_steps, step_batches, training_streams
from elmo_core.training.step import TrainingStep

SENTENCES = [f"sentence {i} has {'some ' * (i % 5)}words" for i in range(40)]
MODEL = tiny().model_copy(update={"num_samples": 5, "dropout": 0.0})
CPU = torch.device("cpu")


def _losses(dataset: str, *, carry: bool, steps: int = 4) -> list[float]:
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    torch.manual_seed(0)
    bilm = BiLM(MODEL, vocab_size=manifest.vocab.size).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=3, unroll_steps=4, lr=0.5))
    streams = training_streams(step, dataset, manifest, (1, 2))
    with step_batches(step, streams, manifest, table, CPU, workers=0) as batches:
        if carry:
            results = [r for _, r in itertools.islice(carried_steps(step, batches, CPU), steps)]
        else:  # every window from a zero state
            windows = itertools.islice(batches, steps)
            results = [step(**b.step_arguments(CPU), state=None) for b in windows]
    return [float(result.output.loss.detach()) for result in results]


def test_each_window_starts_from_the_state_the_last_one_left(make_dataset) -> None:
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)

    carried, reset = _losses(dataset, carry=True), _losses(dataset, carry=False)

    assert carried[0] == reset[0]  # the first window starts from zeros either way
    assert carried[1:] != reset[1:]
