"""``train.capture_step``: the whole step captured once per shape and replayed (CUDA tests are
skipped without a GPU); what decides a graph's shape, and the errors that come before any GPU."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from elmo_core.config import TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.errors import ConfigError
from elmo_core.model.bilm import BiLM, BiLMState
from elmo_core.model.lstm import fused, graphed
from elmo_core.presets import tiny
from elmo_core.training.batches import CandidateSpec, StepBatches, StreamSpec
from elmo_core.training.step import TrainingStep
from elmo_core.training.step_graphs import StepGraphs, shape_key
from pipelines.train.job_config import resolve_train_config, run_name

ROWS, UNROLL, SAMPLES, STEPS = 3, 4, 5, 12
MODEL = tiny().model_copy(update={"num_samples": SAMPLES, "dropout": 0.0})
# 400 sentences over 500 word types of 2 to 13 chars: a step of 16 rows meets a few hundred
SENTENCES = [
    " ".join("w" + "x" * ((i * 7 + j * 13) % 12) + str((i * 31 + j * 17) % 41) for j in range(9))
    for i in range(400)
]
CAPTURED = ["train.capture_step=true", "train.shape_buckets=true"]


@pytest.fixture
def loader(make_dataset):
    """``loader(shape_buckets, rows, unroll, samples, pin_memory) -> (vocab size, StepBatches)``:
    the same windows either way; ``pin_memory`` as the training loop sets it on CUDA."""
    dataset = make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]}, sentences_per_row_group=8)
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    opened: list[StepBatches] = []

    def make(
        shape_buckets: bool,
        rows: int = ROWS,
        unroll: int = UNROLL,
        samples: int = SAMPLES,
        pin_memory: bool = False,
    ) -> tuple[int, StepBatches]:
        draw = CandidateSpec(manifest.vocab.size, num_samples=samples)
        specs = (
            StreamSpec(dataset, rows, unroll, 0, 1, False, 1, candidates=draw),
            StreamSpec(dataset, rows, unroll, 0, 1, True, 2, candidates=draw),
        )
        batches = StepBatches(
            specs, manifest, table, workers=0, pin_memory=pin_memory, shape_buckets=shape_buckets
        )
        opened.append(batches)
        return manifest.vocab.size, batches

    yield make
    for batches in opened:
        batches.close()


def _keys(batches: StepBatches, steps: int) -> list[object]:
    state = (torch.zeros(1, 16, 4), torch.zeros(1, 16, 4))  # a carried state's place
    return [
        shape_key(batch.step_arguments(torch.device("cpu")) | {"state": state}, (0.2,))
        for batch in itertools.islice(batches, steps)
    ]


def test_bucketed_steps_meet_a_few_graph_shapes_and_exact_ones_one_each(loader) -> None:
    """At 16 rows of 10 steps and 64 candidates (PTB's figures: bench_shape_buckets.py)."""
    bucketed = _keys(loader(True, rows=16, unroll=10, samples=64)[1], 40)
    exact = _keys(loader(False, rows=16, unroll=10, samples=64)[1], 40)
    assert len(set(bucketed)) <= 8  # each shape is captured once, then replayed
    assert len(set(exact)) == 40  # the draw counts alone differ at each step


def test_a_number_in_the_arguments_is_part_of_the_shape() -> None:
    ids = torch.zeros(3)
    assert shape_key({"ids": ids, "width": 4}) != shape_key({"ids": ids, "width": 8})
    assert shape_key({"ids": ids}, (0.2,)) != shape_key({"ids": ids}, (0.1,))  # the lr
    assert shape_key({"ids": ids}) == shape_key({"ids": torch.ones(3)})


def test_inside_a_captured_step_the_graphed_lstm_runs_the_fused_ops() -> None:
    stack = graphed.GraphedProjectedLSTM(MODEL.lstm, 8, 0.0)
    with torch.enable_grad():
        assert stack.layer_loop() is not fused.fused_layer
        with graphed.whole_step_captured():
            assert stack.layer_loop() is fused.fused_layer


def test_capturing_needs_buckets_a_gpu_and_one_worker_and_says_so_before_ray() -> None:
    with pytest.raises(ConfigError, match="shape_buckets=true") as error:
        resolve_train_config(overrides=["train.capture_step=true"])
    assert error.value.key == "train.capture_step"
    for run in (["run.use_gpu=false"], ["run.use_gpu=true", "run.num_workers=2"]):
        with pytest.raises(ConfigError, match="one GPU worker's step"):
            resolve_train_config(overrides=[*CAPTURED, *run])
    captured = resolve_train_config(overrides=[*CAPTURED, "run.use_gpu=true"])
    eager = resolve_train_config(overrides=["train.capture_step=false", "run.use_gpu=true"])
    assert captured.train.capture_step and not eager.train.capture_step
    assert run_name(captured, "sha") == run_name(eager, "sha")  # how it runs: the same run


def test_a_step_on_the_cpu_refuses_to_capture() -> None:
    bilm = BiLM(MODEL, vocab_size=50).train()
    train = TrainConfig(batch_size=ROWS, unroll_steps=UNROLL, shape_buckets=True, capture_step=True)
    with pytest.raises(ConfigError, match="on cpu") as error:
        TrainingStep.build(bilm, train)
    assert error.value.key == "train.capture_step"


def _twin_steps(
    vocab_size: int, bf16: bool, batch_directions: bool = True
) -> tuple[TrainingStep, TrainingStep]:
    """The same model twice on CUDA (``auto``: the graphed LSTM): stepped eagerly, and captured."""
    model = MODEL.model_copy(update={"batch_directions": batch_directions})
    steps = []
    for capture_step in (False, True):
        torch.manual_seed(0)
        bilm = BiLM(model, vocab_size=vocab_size).cuda().train()
        train = TrainConfig(
            batch_size=ROWS,
            unroll_steps=UNROLL,
            bf16=bf16,
            shape_buckets=True,
            capture_step=capture_step,
        )
        steps.append(TrainingStep.build(bilm, train))
    return steps[0], steps[1]


@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_float32")
@pytest.mark.parametrize(
    ("bf16", "batch_directions"), [(False, False), (True, True)], ids=["fp32-apart", "bf16-batched"]
)
def test_captured_steps_train_as_eager_ones_on_cuda(loader, bf16, batch_directions) -> None:
    vocab_size, batches = loader(shape_buckets=True)
    eager, captured = _twin_steps(vocab_size, bf16, batch_directions)
    device = torch.device("cuda")
    states: list[BiLMState | None] = [None, None]
    rtol, atol = (2e-2, 1e-3) if bf16 else (1e-4, 1e-6)
    for batch in itertools.islice(batches, STEPS * 2):
        results = [
            step(**batch.step_arguments(device), state=state)
            for step, state in zip((eager, captured), states, strict=True)
        ]
        states = [result.state for result in results]
        torch.testing.assert_close(
            results[1].output.loss, results[0].output.loss, rtol=rtol, atol=atol
        )
        torch.testing.assert_close(results[1].grad_norm, results[0].grad_norm, rtol=rtol, atol=atol)
    assert captured.graphs is not None and captured.graphs.replays > 0
    for (name, ours), (_, theirs) in zip(
        captured.bilm.named_parameters(), eager.bilm.named_parameters(), strict=True
    ):
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol, msg=name)


@pytest.mark.gpu
@pytest.mark.usefixtures("ieee_float32")
def test_a_replayed_step_makes_the_host_wait_for_nothing(loader) -> None:
    """Each step under CUDA's sync check, which warns; the warm-ups and captures may wait (a
    capture begins with a synchronize), the replays may not. The batches are pinned, as the
    training loop pins them on CUDA: a replay's copy from pageable memory would wait."""
    vocab_size, batches = loader(shape_buckets=True, pin_memory=True)
    _, step = _twin_steps(vocab_size, bf16=True)
    assert step.graphs is not None
    device, state, checked = torch.device("cuda"), None, 0
    for batch in itertools.islice(batches, STEPS * 2):
        arguments = batch.step_arguments(device)
        replays = step.graphs.replays
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = step(**arguments, state=state)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        state = result.state
        if step.graphs.replays > replays:
            waits = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
            assert waits == [], "the replay's host waits, each at the Python line that made it"
            checked += 1
    assert checked > 0
    assert math.isfinite(float(result.output.loss))


@pytest.mark.gpu
def test_replays_on_cuda_read_each_call_s_inputs_and_return_copies_of_the_outputs() -> None:
    graphs = StepGraphs(forget_partial=lambda: None)
    weight = torch.ones(3, device="cuda")

    def run(arguments: dict[str, torch.Tensor]) -> tuple[torch.Tensor]:
        weight.add_(1.0)  # state the graph updates in place, as Adagrad's
        return (arguments["x"] * weight,)

    results = []
    for value in range(1, 6):  # two warm-ups, a capture, then replays
        arguments = {"x": torch.full((3,), float(value), device="cuda")}
        results.append(graphs(run, arguments, shape_key(arguments))[0])
    assert graphs.replays == 3 and len(graphs.graphs) == 1
    for value, result in enumerate(results, start=1):  # earlier results kept their values
        torch.testing.assert_close(result, torch.full((3,), float(value * (value + 1))).cuda())


@pytest.mark.gpu
def test_on_cuda_a_shape_that_cannot_be_captured_runs_eagerly_from_then_on(caplog) -> None:
    forgotten = []
    graphs = StepGraphs(forget_partial=lambda: forgotten.append(True))

    def run(arguments: dict[str, torch.Tensor]) -> torch.Tensor:
        return arguments["x"] * float(arguments["x"].sum())  # reads back: no capture allows it

    arguments = {"x": torch.ones(2, device="cuda")}
    for _ in range(5):
        torch.testing.assert_close(graphs(run, arguments, "key"), torch.full((2,), 2.0).cuda())
    assert graphs.eager == {"key"} and not graphs.graphs and graphs.replays == 0
    assert forgotten == [True]
    assert "could not be captured" in caplog.text
