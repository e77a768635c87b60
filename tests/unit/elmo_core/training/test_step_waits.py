"""With what the data loader finds ahead, nothing in the training step makes the host wait.

On a GPU a host that reads a value back (``.item()``, ``int()``) or runs an op whose output size
depends on the data (``nonzero``, ``unique``, sparse ``coalesce``, boolean indexing) stops until
every queued kernel has run, and the next step cannot be queued behind this one. The step is run
here on the CPU under a dispatch mode that sees every op it calls, backward included.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.training.batches import CandidateSpec, StepBatches, StreamSpec
from elmo_core.training.step import TrainingStep

ROWS, UNROLL, SAMPLES = 3, 4, 5
MODEL = tiny().model_copy(update={"num_samples": SAMPLES})
SENTENCES = [f"sentence {i} has {'some ' * (i % 5)}words" for i in range(40)]
DATA_SIZED = {  # ops whose output size is found from the data, on the device
    "aten::nonzero",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::masked_select",
    "aten::_coalesce",
    "aten::_to_sparse",
    "aten::to_sparse",
    "aten::bincount",
}
READ_BACK = {"aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero"}


class HostWaits(TorchDispatchMode):
    """Records the ops that would make the host wait for a GPU. ``host_side``: tensors that stay
    on the host in a GPU run too (torch's optimiser step counters), free to read."""

    def __init__(self, host_side: list[torch.Tensor]) -> None:
        super().__init__()
        self.host_side = host_side
        self.waits: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:  # noqa: ANN001
        name, kwargs = func._schema.name, kwargs or {}
        sized_by_data = name in DATA_SIZED or (
            name == "aten::repeat_interleave" and "output_size" not in kwargs
        )
        reads_back = name in READ_BACK and not any(args[0] is held for held in self.host_side)
        if sized_by_data or reads_back:
            self.waits.append(name)
        elif name in ("aten::index", "aten::index_put", "aten::index_put_") and _bool_index(
            args[1]
        ):
            self.waits.append(f"{name} (boolean mask)")
        return func(*args, **kwargs)


def _bool_index(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


@pytest.fixture(params=[False, True], ids=["exact", "shape_buckets"])
def batches(make_dataset, request):
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)
    manifest = load_manifest(dataset)
    draw = CandidateSpec(manifest.vocab.size, num_samples=SAMPLES)
    specs = tuple(
        StreamSpec(dataset, ROWS, UNROLL, 0, 1, reverse, seed, candidates=draw)
        for reverse, seed in ((False, 1), (True, 2))
    )
    table = load_word_types(dataset, manifest).char_ids
    with StepBatches(
        specs, manifest, table, workers=0, pin_memory=False, shape_buckets=request.param
    ) as loaded:
        yield manifest.vocab.size, loaded


@pytest.mark.parametrize("batch_directions", [False, True])
def test_a_step_on_loaded_batches_never_waits_for_the_device(batches, batch_directions) -> None:
    vocab_size, loaded = batches
    torch.manual_seed(0)
    model = MODEL.model_copy(update={"batch_directions": batch_directions})
    bilm = BiLM(model, vocab_size=vocab_size).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=ROWS, unroll_steps=UNROLL))
    state = None
    for _ in range(3):  # the first step from zero states, then carried ones
        arguments = next(loaded).step_arguments(torch.device("cpu"))
        counters = [held["step"] for held in step.optimizer.state.values()]
        with HostWaits(counters) as mode:
            state = step(**arguments, state=state).state
        assert mode.waits == []


def test_the_check_sees_a_step_that_finds_its_rows_on_the_device(batches) -> None:
    vocab_size, loaded = batches
    bilm = BiLM(MODEL, vocab_size=vocab_size).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=ROWS, unroll_steps=UNROLL))
    arguments = next(loaded).step_arguments(torch.device("cpu"))
    del arguments["softmax_rows"], arguments["types"]
    with HostWaits([held["step"] for held in step.optimizer.state.values()]) as mode:
        step(**arguments, state=None)
    assert "aten::_unique2" in mode.waits  # each direction finds its softmax rows
    assert "aten::unique_dim" in mode.waits  # the char CNN finds the token types
