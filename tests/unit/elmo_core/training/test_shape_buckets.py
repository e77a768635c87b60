"""With ``shape_buckets`` every tensor of the step keeps its shape within a bucket, and the padding
changes neither the loss, nor a gradient, nor what Adagrad does with them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training import batches as batches_module
from elmo_core.training.batches import (
    ROWS_PER_OCTAVE,
    TYPES_PER_OCTAVE,
    WIDTH_PER_OCTAVE,
    CandidateSpec,
    StepBatch,
    StepBatches,
    StreamSpec,
    bucket,
    pad_rows,
)
from elmo_core.training.step import TrainingStep

ROWS, UNROLL, SAMPLES, STEPS = 3, 4, 5, 8
MODEL = tiny().model_copy(update={"num_samples": SAMPLES})
SENTENCES = [f"sentence {i} has {'some ' * (i % 5)}words" for i in range(40)]
TRAIN = TrainConfig(batch_size=ROWS, unroll_steps=UNROLL)


@pytest.fixture
def loader(make_dataset):
    """``loader(shape_buckets) -> (vocab size, StepBatches)``, the same windows either way."""
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    draw = CandidateSpec(manifest.vocab.size, num_samples=SAMPLES)
    specs = tuple(
        StreamSpec(dataset, ROWS, UNROLL, 0, 1, reverse, seed, candidates=draw)
        for reverse, seed in ((False, 1), (True, 2))
    )
    opened: list[StepBatches] = []

    def make(shape_buckets: bool) -> tuple[int, StepBatches]:
        opened.append(
            StepBatches(specs, manifest, table, workers=0, pin_memory=False, shape_buckets=True)
            if shape_buckets
            else StepBatches(specs, manifest, table, workers=0, pin_memory=False)
        )
        return manifest.vocab.size, opened[-1]

    yield make
    for batches in opened:
        batches.close()


def test_buckets_pad_by_less_than_a_quarter_to_few_sizes() -> None:
    sizes = {bucket(size, 10**6, per_octave=4) for size in range(2049, 4097)}
    assert sizes == {2560, 3072, 3584, 4096}
    for size in range(1, 5000):
        padded = bucket(size, 10**6, per_octave=4)
        assert size <= padded < 1.25 * size or padded == size
        assert bucket(padded, 10**6, per_octave=4) == padded  # a bucket is its own bucket
    assert [bucket(width, 50, per_octave=1) for width in (0, 5, 9, 17, 40)] == [0, 8, 16, 32, 50]
    assert bucket(3000, 3001, per_octave=4) == 3001  # never past the cap


def test_padded_rows_stay_sorted_and_distinct_and_hold_the_touched_ones() -> None:
    rows = np.array([0, 2, 3, 7, 12])
    padded = pad_rows(rows, 9)
    np.testing.assert_array_equal(padded, [0, 1, 2, 3, 4, 5, 6, 7, 12])
    np.testing.assert_array_equal(pad_rows(rows, 5), rows)


def _shapes(arguments: dict[str, Any]) -> list[tuple[int, ...] | object]:
    """Each tensor's shape, and every other leaf, of a step's arguments."""
    leaves, _ = tree_flatten(arguments)
    return [tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]


def _key(batch: StepBatch) -> tuple[int, int, int]:
    assert batch.softmax_rows is not None
    return len(batch.types.char_ids), len(batch.softmax_rows), batch.types.used_width


def test_loaded_steps_keep_every_shape_within_a_bucket(loader) -> None:
    _, batches = loader(shape_buckets=True)
    seen: dict[tuple[int, int, int], list[Any]] = {}
    for batch in (next(batches) for _ in range(STEPS)):
        types, rows = batch.types, batch.softmax_rows
        assert rows is not None
        width = types.char_ids.shape[1]
        assert bucket(len(types.char_ids), types.inverse.numel(), TYPES_PER_OCTAVE) == len(
            types.char_ids
        )
        assert bucket(len(rows), 10**9, ROWS_PER_OCTAVE) == len(rows)
        assert bucket(types.used_width, width, WIDTH_PER_OCTAVE) == types.used_width
        assert int(types.inverse.max()) < len(types.char_ids)
        assert bool((rows[1:] > rows[:-1]).all())  # sorted, distinct
        shapes = _shapes(batch.step_arguments(torch.device("cpu")))
        assert seen.setdefault(_key(batch), shapes) == shapes
    assert len(seen) < STEPS  # some steps share a bucket


def _three_steps(vocab_size: int, batches: StepBatches) -> tuple[Any, ...]:
    """Three CPU steps from the same start: the losses, norms, gradients the optimiser was given,
    parameters, accumulators, initial parameters and every softmax row the steps gathered."""
    torch.manual_seed(0)
    bilm = BiLM(MODEL, vocab_size=vocab_size).train()
    initial = {name: p.detach().clone() for name, p in bilm.named_parameters()}
    step = TrainingStep.build(bilm, TRAIN)  # sparse softmax gradient, row Adagrad
    gradients: list[dict[str, torch.Tensor]] = []
    update = step.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        named = bilm.named_parameters()
        gradients.append({n: p.grad.to_dense().clone() for n, p in named if p.grad is not None})
        return update(*args, **kwargs)

    step.optimizer.step = recording_step  # type: ignore[method-assign]
    state, losses, norms, gathered = None, [], [], set()
    for _ in range(3):
        batch = next(batches)
        assert batch.softmax_rows is not None
        gathered |= set(batch.softmax_rows.tolist())
        result = step(**batch.step_arguments(torch.device("cpu")), state=state)
        state = result.state
        losses.append(result.output.loss.detach())
        norms.append(result.grad_norm)
    sums = {name: step.optimizer.state[p]["sum"] for name, p in bilm.named_parameters()}
    return losses, norms, gradients, dict(bilm.named_parameters()), sums, initial, gathered


def test_padding_leaves_the_loss_gradients_and_updates_exact(loader, monkeypatch) -> None:
    monkeypatch.setattr(batches_module, "ROWS_PER_OCTAVE", 1)  # padded to reach untouched rows
    results = [_three_steps(*loader(shape_buckets)) for shape_buckets in (False, True)]
    (losses, norms, gradients, parameters, sums, _, touched), padded = results
    torch.testing.assert_close(padded[0], losses, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(padded[1], norms, rtol=1e-6, atol=1e-7)
    for ours, exact in zip(padded[2], gradients, strict=True):
        torch.testing.assert_close(ours, exact, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(padded[3], parameters, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(padded[4], sums, rtol=1e-5, atol=1e-7)
    # the rows only padding touched: no gradient, parameters and accumulators as they started
    padding_only = sorted(padded[6] - touched)
    assert padding_only
    for name in ("softmax.weight", "softmax.bias"):
        for gradient in padded[2]:
            assert bool((gradient[name][padding_only] == 0).all())
        assert torch.equal(padded[3][name][padding_only], padded[5][name][padding_only])
        start = torch.full_like(padded[4][name][padding_only], TRAIN.initial_accumulator)
        assert torch.equal(padded[4][name][padding_only], start)


def test_a_wider_char_cut_encodes_each_token_the_same(loader) -> None:
    vocab_size, exact = loader(shape_buckets=False)
    _, padded = loader(shape_buckets=True)
    encoder = BiLM(MODEL, vocab_size=vocab_size).token_encoder
    for _ in range(3):
        ours, theirs = next(padded), next(exact)
        assert ours.types.used_width >= theirs.types.used_width
        arguments = theirs.step_arguments(torch.device("cpu"))
        char_ids = torch.stack([arguments["forward_inputs"], arguments["backward_inputs"]])
        torch.testing.assert_close(
            encoder.encode_types(char_ids, ours.types),
            encoder.encode_types(char_ids, theirs.types),
            rtol=1e-6,
            atol=1e-7,
        )


class OpRecord(TorchDispatchMode):
    """Each op's name, output shapes and number arguments (a Python number that changed
    between steps would be baked into a CUDA graph as the first step's)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[Any], list[Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten((args, kwargs or {}))
        outputs, _ = tree_flatten(out)
        self.ops.append(
            (
                func._schema.name,
                [tuple(o.shape) for o in outputs if isinstance(o, torch.Tensor)],
                [leaf for leaf in leaves if isinstance(leaf, int | float)],  # bools included
            )
        )
        return out


def _meta_steps(vocab_size: int, batches: StepBatches) -> Iterator[tuple[Any, list[Any]]]:
    """Steps on the meta device (CUDA's rules without a GPU), each with its bucket and its ops."""
    torch.manual_seed(0)
    bilm = BiLM(MODEL, vocab_size=vocab_size).train().to("meta")
    step = TrainingStep.build(bilm, TRAIN, "dense")  # meta has no sparse kernels
    meta = torch.device("meta")
    state = step(**next(batches).step_arguments(meta), state=None).state  # the state moves once
    while True:
        batch = next(batches)
        with OpRecord() as record:
            state = step(**batch.step_arguments(meta), state=state).state
        yield _key(batch), record.ops


def test_steps_in_one_bucket_make_the_same_ops_on_the_meta_device(loader) -> None:
    steps = _meta_steps(*loader(shape_buckets=True))
    first: dict[tuple[int, int, int], list[Any]] = {}
    compared = 0
    for _ in range(STEPS):
        key, ops = next(steps)
        if key in first:
            assert ops == first[key]
            compared += 1
        first.setdefault(key, ops)
    assert compared > 0


def test_without_buckets_the_steps_shapes_follow_the_data(loader) -> None:
    steps = _meta_steps(*loader(shape_buckets=False))
    shapes = {tuple(shape for _, outputs, _ in next(steps)[1] for shape in outputs)}
    shapes |= {tuple(shape for _, outputs, _ in next(steps)[1] for shape in outputs)}
    assert len(shapes) == 2  # the check would see an unpadded step
