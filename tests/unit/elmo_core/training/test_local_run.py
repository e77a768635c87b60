"""Training in one process: the worker's data path and step, whatever builds the batches."""

from __future__ import annotations

import itertools

import torch

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training.local_run import step_results
from elmo_core.training.step import TrainingStep

SENTENCES = [f"sentence {i} has {'some ' * (i % 5)}words" for i in range(40)]
MODEL = tiny().model_copy(update={"num_samples": 5})


def _losses(dataset: str, workers: int, steps: int = 6) -> list[float]:
    torch.manual_seed(0)
    bilm = BiLM(MODEL, vocab_size=load_manifest(dataset).vocab.size).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=3, unroll_steps=4, lr=0.5))
    results = step_results(step, dataset, torch.device("cpu"), workers=workers)
    losses = [float(result.output.loss.detach()) for result in itertools.islice(results, steps)]
    results.close()  # stops the loader's processes
    return losses


def test_losses_are_the_same_whoever_builds_the_batches_and_they_fall(make_dataset):
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)
    in_loop = _losses(dataset, 0, steps=30)
    assert _losses(dataset, workers=2) == in_loop[:6]
    assert sum(in_loop[-5:]) < sum(in_loop[:5])  # it learns
