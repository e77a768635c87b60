"""The loop core: each step starts from the LSTM state the previous one left (truncated BPTT)."""

from __future__ import annotations

import itertools
import math

import torch

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.model.lstm.reference import LSTMState
from elmo_core.presets import tiny
from elmo_core.training.loop import StateReset, carried_steps, step_batches, training_streams
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


class _RecordingStep:
    """The real step, keeping the state each window started from."""

    def __init__(self, step: TrainingStep) -> None:
        self.step, self.train, self.states = step, step.train, []
        self.agree_on_rows = step.agree_on_rows

    def __call__(self, **arguments):
        self.states.append(arguments["state"])
        return self.step(**arguments)


def _starting_states(dataset: str, state_reset: float, steps: int, rows: int = 8) -> list:
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    torch.manual_seed(0)
    bilm = BiLM(MODEL, vocab_size=manifest.vocab.size).train()
    train = TrainConfig(batch_size=rows, unroll_steps=3, lr=0.5, state_reset=state_reset)
    step = TrainingStep.build(bilm, train)
    recording = _RecordingStep(step)
    streams = training_streams(step, dataset, manifest, (1, 2))
    with step_batches(step, streams, manifest, table, CPU, workers=0) as batches:
        for _ in itertools.islice(carried_steps(recording, batches, CPU), steps):  # type: ignore[arg-type]
            pass
    return recording.states


def _zeroed_rows(states: list) -> int:
    """Rows of either stack that start a window from zero, after the first window."""
    return sum(
        int(((stack.h == 0).all(-1).all(0) & (stack.c == 0).all(-1).all(0)).sum())
        for state in states[1:]
        for stack in state
    )


def test_the_configured_fraction_of_rows_starts_each_window_from_zero(make_dataset) -> None:
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)
    steps, rows, fraction = 41, 8, 0.25

    reset = _zeroed_rows(_starting_states(dataset, fraction, steps, rows))
    carried = _zeroed_rows(_starting_states(dataset, 0.0, steps, rows))

    draws = (steps - 1) * rows * 2  # per window after the first, per row, per direction
    expected, spread = draws * fraction, math.sqrt(draws * fraction * (1 - fraction))
    assert abs(reset - expected) < 4 * spread  # 160 ± 11
    assert carried == 0  # bilm-tf: only the first window starts from zero


def test_the_rows_reset_at_a_step_depend_on_the_seed_and_step_alone() -> None:
    state = tuple(LSTMState(torch.ones(2, 64, 3), torch.ones(2, 64, 5)) for _ in range(2))
    reset = StateReset(0.5, seed=7, device=CPU)

    def zeroed(step: int, seed: int = 7) -> torch.Tensor:
        after = StateReset(0.5, seed=seed, device=CPU)(state, step)
        return torch.stack([stack.c[0, :, 0] == 0 for stack in after])  # (2, B)

    first = zeroed(5)
    reset(state, 4)  # what was drawn before does not matter: a resumed run draws the same
    assert torch.equal(torch.stack([s.c[0, :, 0] == 0 for s in reset(state, 5)]), first)
    assert not torch.equal(zeroed(6), first)
    assert not torch.equal(zeroed(5, seed=8), first)
    assert not torch.equal(first[0], first[1])  # the directions draw apart
