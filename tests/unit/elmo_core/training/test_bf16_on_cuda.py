"""bf16 autocast training on CUDA follows fp32's loss curve (issue 13); skipped without a GPU.

300 steps of ``small`` on real English (the bundled ``python-docs`` corpus, prepared by the real
prepare stage), batches and candidates from the training data loader, the step a worker runs:
past the first 50 steps the bf16 run's mean loss over every 10 steps stays within 2% of the fp32
run's, nothing is NaN or infinite, and what must stay float32 does (Adagrad's accumulators, the
softmax's parameters). In those first 50 steps the loss falls 3 nats, so a gap at one step
measures a shift of a step or two, not precision: on an H200 it reached 5.4% at steps 11-20 and
stayed under 1% from step 50 to 300 (benchmarks/results/gpu_first_contact-2026-11-27.md).
"""

from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

from elmo_core.config import PrepareConfig, TrainConfig
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.presets import small
from elmo_core.training.local_run import step_results
from elmo_core.training.loop import StateReset, step_batches, training_streams
from elmo_core.training.step import TrainingStep
from pipelines.prepare.corpus_sources import SAMPLE_CORPUS, locate_corpus
from pipelines.prepare.stage import prepare_files

pytestmark = pytest.mark.gpu

# The first-contact run (infra/device/first_contact.py) checks 100 steps within its time box.
STEPS = int(os.environ.get("ELMO_BF16_STEPS", "300"))
LOG_EVERY, ROWS, UNROLL = 10, 128, 20
SETTLED, TOLERANCE = 50, 0.02  # steps


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("python-docs")
    corpus = locate_corpus(SAMPLE_CORPUS, "text", root / "cache")
    out = root / "dataset"
    prepare_files(PrepareConfig(format="text"), corpus, str(out))
    return str(out)


def loss_curve(dataset: str, device: torch.device, bf16: bool, steps: int = STEPS):
    """Mean sampled loss of every ``LOG_EVERY`` steps, and the trained step (model, optimiser)."""
    config = small()
    torch.manual_seed(0)  # the same weights and dropout masks in both runs
    bilm = BiLM(config, load_manifest(dataset).vocab.size).to(device).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=ROWS, unroll_steps=UNROLL, bf16=bf16))
    losses = [
        result.output.loss.detach().float()
        for result in itertools.islice(step_results(step, dataset, device), steps)
    ]
    curve = [
        float(torch.stack(losses[i : i + LOG_EVERY]).mean()) for i in range(0, steps, LOG_EVERY)
    ]
    return curve, step


@pytest.mark.usefixtures("ieee_float32")
def test_bf16_follows_the_fp32_loss_curve_and_keeps_fp32_where_it_must(dataset, record_property):
    device = torch.device("cuda")
    fp32, _ = loss_curve(dataset, device, bf16=False)
    bf16, step = loss_curve(dataset, device, bf16=True)

    gaps = [abs(low - full) / full for low, full in zip(bf16, fp32, strict=True)]
    for name, curve in (("fp32", fp32), ("bf16", bf16), ("gaps", gaps)):  # in the JUnit report
        record_property(name, [round(value, 4) for value in curve])
    assert all(math.isfinite(loss) for loss in fp32 + bf16)
    assert fp32[-1] < fp32[0]  # it trained
    settled = gaps[SETTLED // LOG_EVERY :]
    assert settled and max(settled) <= TOLERANCE, [round(gap, 4) for gap in gaps]
    softmax = step.bilm.softmax
    assert softmax is not None and softmax.weight.dtype == softmax.bias.dtype == torch.float32
    accumulators = [state["sum"] for state in step.optimizer.state.values()]
    assert accumulators and all(a.dtype == torch.float32 for a in accumulators)
    assert all(torch.isfinite(a).all() for a in accumulators)


def test_a_training_step_makes_the_host_wait_for_nothing(dataset):
    """The step a worker runs, with rows restarted from zero, under CUDA's sync check: the
    batch's copies are made before it, as the loader makes them. The steps before it compile
    and capture what the device's LSTM choice compiles (a replay is what every later step runs)."""
    device = torch.device("cuda")
    manifest = load_manifest(dataset)
    torch.manual_seed(0)
    bilm = BiLM(small(), manifest.vocab.size).to(device).train()
    step = TrainingStep.build(bilm, TrainConfig(batch_size=ROWS, unroll_steps=UNROLL))
    table = load_word_types(dataset, manifest).char_ids
    streams = training_streams(step, dataset, manifest, (1, 2))
    reset = StateReset(0.5, seed=0, device=device)
    with step_batches(step, streams, manifest, table, device, workers=0) as batches:
        *earlier, checked = itertools.islice(batches, 4)
        state = None
        for batch in earlier:
            state = step(**batch.step_arguments(device), state=state).state
        arguments = checked.step_arguments(device)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = step(**arguments, state=reset(state, 4))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert math.isfinite(float(result.output.loss))
