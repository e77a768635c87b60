"""The softmax-gradient exchanges (the rows' union all-reduced, the padded rows all-gathered)
equal a dense all-reduce, and 2 or 4 data-parallel ranks train as one rank on all their rows:
real gloo processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elmo_core.config import TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.sampler import SampledCandidates, touched_rows
from elmo_core.model.softmax import SampledSoftmax
from elmo_core.presets import tiny
from elmo_core.training.gradient_exchange import (
    ExchangeMode,
    agree_on_rows,
    clip_global_norm,
    exchange_rows,
    exchange_softmax_gradients,
    ring_bytes,
)
from elmo_core.training.step import EXCHANGE_LAUNCHED, TrainingStep

ROOT = Path(__file__).resolve().parents[4]
WORLD_SIZE = 2
NUM_CLASSES, DIM, NUM_SAMPLES = 50, 6, 8
BOUND = 8 + NUM_SAMPLES  # the most rows a rank's batch touches: its positions and candidates


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(rank: int, port: int, body: Callable[[int], None], world_size: int) -> None:
    # One thread a rank, as a Ray Train worker takes its share: four ranks of two spinning OpenMP
    # threads each on two cores spent most of their time waiting for each other.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        body(rank)
    finally:
        dist.destroy_process_group()


def _run_on_ranks(body: Callable[[int], None], world_size: int = WORLD_SIZE) -> None:
    """Run ``body(rank)`` in ``world_size`` gloo processes; an assertion in any fails the test.

    The ranks are forked from a fresh interpreter running this file, not from the pytest process:
    by this point of a full run that process holds Ray, Prefect and MLflow threads, and a fork of
    it is not safe.
    """
    result = subprocess.run(
        [sys.executable, "-m", __spec__.name, body.__name__, str(world_size)],  # type: ignore[name-defined]
        cwd=ROOT,  # where the module is found, as pytest finds it
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _fork_ranks(body: Callable[[int], None], world_size: int) -> None:
    mp.start_processes(
        _entry,
        args=(_free_port(), body, world_size),
        nprocs=world_size,
        start_method="fork",
        join=True,
    )


def _softmax_with_grads(rank: int, sparse: bool) -> SampledSoftmax:
    """The same softmax on every rank, a different batch (and candidate draw) per rank."""
    torch.manual_seed(0)
    softmax = SampledSoftmax(NUM_CLASSES, DIM, NUM_SAMPLES, sparse=sparse)
    generator = torch.Generator().manual_seed(100 + rank)
    hidden = torch.randn(5 + 3 * rank, DIM, generator=generator)  # (N, P): sizes differ by rank
    targets = torch.randint(0, NUM_CLASSES, (hidden.shape[0],), generator=generator)
    softmax(hidden, targets, generator).sum().backward()
    return softmax


def _dense_reference(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    reference = _softmax_with_grads(rank, sparse=False)
    assert reference.weight.grad is not None and reference.bias.grad is not None
    grads = [reference.weight.grad.clone(), reference.bias.grad.clone()]
    for grad in grads:
        dist.all_reduce(grad)
        grad /= WORLD_SIZE
    return grads[0], grads[1]


def _rows_of_different_sizes(rank: int) -> None:
    indices = torch.tensor([3, 7, 3] if rank == 0 else [7, 1, 9, 0, 9])
    rows = torch.arange(indices.numel() * 2, dtype=torch.float32).reshape(-1, 2) + 10 * rank
    dense = torch.zeros(12, 2).index_add_(0, indices, rows)
    dist.all_reduce(dense)
    ids, averaged = exchange_rows(indices, rows, 12, bound=6)  # static: 2 × 6 slots, no read
    assert ids.tolist() == [0, 1, 3, 7, 9] + [11] * 7  # then padding: the last id, zero rows
    torch.testing.assert_close(averaged[:5], dense[ids[:5]] / WORLD_SIZE)
    assert not averaged[5:].any()
    torch.testing.assert_close(torch.zeros(12, 2).index_add_(0, ids, averaged), dense / WORLD_SIZE)
    with pytest.raises(ValueError, match="5 softmax rows, over the static bound 4"):
        exchange_rows(torch.arange(5), torch.zeros(5, 2), 12, bound=4)


def test_exchange_rows_averages_variable_size_row_sets_like_a_dense_all_reduce() -> None:
    _run_on_ranks(_rows_of_different_sizes)


def _exchange_reads_nothing_back(rank: int) -> None:
    """Under the dispatch mode that sees every op: no value read back, no data-sized output."""
    from tests.unit.elmo_core.training.test_step_waits import HostWaits

    indices = torch.tensor([3, 7, 3, 1] if rank == 0 else [7, 1, 9])
    rows = torch.ones(indices.numel(), 2)
    with HostWaits([]) as waits:
        exchange_rows(indices, rows, 12, bound=4)
    assert waits.waits == []


def test_the_exchange_of_rows_makes_the_host_wait_for_nothing() -> None:
    _run_on_ranks(_exchange_reads_nothing_back)


def _softmax_exchange_matches_dense(rank: int) -> None:
    expected_weight, expected_bias = _dense_reference(rank)
    sent = {}
    for mode in ("union", "sparse"):
        softmax = _softmax_with_grads(rank, sparse=True)
        assert softmax.weight.grad is not None and softmax.weight.grad.is_sparse
        mine = softmax.weight.grad.coalesce().indices()[0]
        union = agree_on_rows(mine, NUM_CLASSES)  # every rank's rows, once each
        everyone = [torch.empty(NUM_CLASSES, dtype=torch.bool) for _ in range(WORLD_SIZE)]
        dist.all_gather(
            everyone, torch.zeros(NUM_CLASSES, dtype=torch.bool).index_fill_(0, mine, True)
        )
        assert union.tolist() == torch.stack(everyone).any(0).nonzero().squeeze(1).tolist()
        sent[mode] = exchange_softmax_gradients(
            softmax.weight, softmax.bias, mode, BOUND, union if mode == "union" else None
        )
        assert softmax.weight.grad.is_sparse and softmax.bias.grad is not None
        torch.testing.assert_close(softmax.weight.grad.to_dense(), expected_weight)
        torch.testing.assert_close(softmax.bias.grad.to_dense(), expected_bias)
    assert sent["union"] == ring_bytes("all_reduce", len(union) * (DIM + 1) * 4, WORLD_SIZE)
    assert sent["sparse"] == ring_bytes("all_gather", BOUND * ((DIM + 1) * 4 + 8), WORLD_SIZE)
    dense = _softmax_with_grads(rank, sparse=True)
    dense_sent = exchange_softmax_gradients(dense.weight, dense.bias, "dense", BOUND)
    assert dense.weight.grad is not None and not dense.weight.grad.is_sparse
    torch.testing.assert_close(dense.weight.grad, expected_weight)
    assert 0 < sent["union"] < dense_sent == NUM_CLASSES * (DIM + 1) * 4


def test_row_softmax_gradients_equal_the_dense_all_reduce_average() -> None:
    _run_on_ranks(_softmax_exchange_matches_dense)


def _adagrad_steps_agree(rank: int) -> None:
    updated = {}
    for mode in ("sparse", "dense"):
        softmax = _softmax_with_grads(rank, sparse=True)
        exchange_softmax_gradients(softmax.weight, softmax.bias, mode, BOUND)
        clip_global_norm(softmax.parameters(), 0.5)
        optimizer = torch.optim.Adagrad(softmax.parameters(), lr=0.2, initial_accumulator_value=1)
        optimizer.step()
        updated[mode] = [p.detach().clone() for p in softmax.parameters()]
    for sparse_param, dense_param in zip(updated["sparse"], updated["dense"], strict=True):
        torch.testing.assert_close(sparse_param, dense_param)
    others = [torch.empty_like(updated["sparse"][0]) for _ in range(WORLD_SIZE)]
    dist.all_gather(others, updated["sparse"][0])
    torch.testing.assert_close(others[0], others[1], rtol=0, atol=0)  # ranks stay identical


def test_adagrad_after_sparse_exchange_equals_adagrad_after_dense_all_reduce() -> None:
    _run_on_ranks(_adagrad_steps_agree)


def test_exchange_is_the_identity_without_a_process_group() -> None:
    softmax = _softmax_with_grads(0, sparse=True)
    assert softmax.weight.grad is not None
    expected = softmax.weight.grad.to_dense().clone()
    assert exchange_softmax_gradients(softmax.weight, softmax.bias, "sparse", BOUND) == 0
    torch.testing.assert_close(softmax.weight.grad.to_dense(), expected)


@pytest.mark.parametrize("max_norm", [0.01, 1e6])
def test_global_norm_clip_counts_sparse_rows_like_their_dense_form(max_norm: float) -> None:
    sparse = _softmax_with_grads(0, sparse=True)
    dense = _softmax_with_grads(0, sparse=False)
    sparse_norm = float(clip_global_norm(sparse.parameters(), max_norm))
    dense_norm = float(clip_global_norm(dense.parameters(), max_norm))
    assert sparse_norm == pytest.approx(dense_norm, rel=1e-6)
    assert sparse.weight.grad is not None and dense.weight.grad is not None
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad)
    clipped = torch.cat([p.grad.to_dense().flatten() for p in sparse.parameters()])  # type: ignore[union-attr]
    assert float(clipped.norm()) == pytest.approx(min(max_norm, dense_norm), rel=1e-5)


STEP_ROWS, STEP_UNROLL, STEP_VOCAB, STEPS = 2, 4, 300, 20  # rows per rank
ONE_RANK_ENV = "ELMO_TEST_ONE_RANK"
DEVICE_ENV = "ELMO_TEST_DEVICE"  # where the ranks train: cpu, or all on CUDA device 0 (gloo)
EXCHANGE_ENV = "ELMO_TEST_EXCHANGE"  # run.grad_exchange


def _step_windows(step: int, rows: slice, device: str, world_size: int) -> dict[str, torch.Tensor]:
    """Step ``step``'s windows of all ``world_size × STEP_ROWS`` rows, cut to ``rows``: every
    target scored, so each rank's mean loss weighs as many tokens."""
    generator = torch.Generator().manual_seed(1_000 + step)
    width = tiny().char_cnn.max_chars_per_token
    shape = (world_size * STEP_ROWS, STEP_UNROLL)
    windows = {
        f"{name}_{part}": (
            torch.randint(1, 262, (*shape, width), generator=generator)
            if part == "inputs"
            else torch.randint(0, STEP_VOCAB, shape, generator=generator)
        )
        for name in ("forward", "backward")
        for part in ("inputs", "targets")
    }
    return {key: value[rows].to(device) for key, value in windows.items()}


def _built_step(
    rows: slice,
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module],
    device: str,
    mode: ExchangeMode,
    world_size: int,
    overlap_exchange: bool = True,
) -> tuple[TrainingStep, Callable[[int], dict[str, Any]]]:
    """The same model's step on every rank (no dropout, float32), and each step's arguments on
    ``rows`` but the state: the candidates drawn alike everywhere (a run draws them per rank; here
    they must match the one rank's) and the softmax rows found ahead, as the loader finds them."""
    torch.manual_seed(0)
    model = tiny().model_copy(update={"dropout": 0.0})
    bilm = BiLM(model, vocab_size=STEP_VOCAB).train().to(device)
    train = TrainConfig(batch_size=STEP_ROWS, unroll_steps=STEP_UNROLL, clip_norm=0.5, bf16=False)
    step = TrainingStep.build(bilm, train, mode, wrap_model, overlap_exchange)
    softmax = bilm.softmax
    assert softmax is not None

    def arguments(index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(index)
        drawn = [softmax.sampler.sample_unique(model.num_samples, generator) for _ in range(2)]
        windows: dict[str, Any] = _step_windows(index, rows, device, world_size)
        targets = torch.cat([windows["forward_targets"], windows["backward_targets"]]).cpu()
        found = torch.from_numpy(touched_rows(targets.numpy(), *(d.ids.numpy() for d in drawn)))
        return windows | {
            "candidates": tuple(SampledCandidates(d.ids.to(device), d.num_tries) for d in drawn),
            "softmax_rows": found.to(device),
            "row_union": step.agree_on_rows(found),
        }

    return step, arguments


def _train_steps(
    rows: slice,
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module],
    device: str,
    mode: ExchangeMode,
    world_size: int,
) -> tuple[torch.Tensor, torch.Tensor, list[float], list[int]]:
    """``STEPS`` training steps of :func:`_built_step`. Returns the parameters, the Adagrad
    state, and each step's loss and softmax bytes sent."""
    step, arguments = _built_step(rows, wrap_model, device, mode, world_size)
    state, losses, sent = None, [], []
    for index in range(STEPS):
        result = step(**arguments(index), state=state)
        state = result.state
        losses.append(float(result.output.loss.detach()))
        sent.append(result.softmax_bytes)
    parameters = list(step.bilm.parameters())
    weights = torch.cat([p.detach().flatten() for p in parameters]).cpu()
    accumulators = [step.optimizer.state[p]["sum"].flatten() for p in parameters]
    return weights, torch.cat(accumulators).cpu(), losses, sent


def _exchange_launched_before_the_lstm_backward(rank: int) -> None:
    """The profiler's order of one step's ops: the union exchange launches once the softmax's
    gradients exist, before the LSTMs' backward; with the overlap off, after the backward."""
    from torch.nn.parallel import DistributedDataParallel

    mine = slice(rank * STEP_ROWS, (rank + 1) * STEP_ROWS)
    for overlap in (True, False):
        step, arguments = _built_step(
            mine, DistributedDataParallel, "cpu", "union", dist.get_world_size(), overlap
        )
        state = step(**arguments(0), state=None).state
        with torch.profiler.profile() as profile:
            step(**arguments(1), state=state)
        events = sorted(profile.events(), key=lambda event: event.time_range.start)
        names = [event.name for event in events]
        lstm = next(i for i, name in enumerate(names) if "lstm_layer_backward" in name)
        if overlap:
            assert names.index(EXCHANGE_LAUNCHED) < lstm
            reduced = [i for i, name in enumerate(names) if "allreduce" in name]
            assert min(reduced) < lstm  # an all-reduce began before the LSTMs' backward
        else:
            assert EXCHANGE_LAUNCHED not in names


def test_the_union_exchange_is_launched_before_the_lstms_backward() -> None:
    _run_on_ranks(_exchange_launched_before_the_lstm_backward)


def _ranks_train_as_one(rank: int) -> None:
    """DDP for the dense weights, the softmax rows exchanged apart: after 20 steps every rank
    holds the same weights and Adagrad state, and those of one rank that took all ranks' rows
    (trained by the test, outside any process group: ``ONE_RANK_ENV`` names its file); each
    step's mean loss over the ranks is that rank's."""
    from torch.nn.parallel import DistributedDataParallel

    world_size = dist.get_world_size()
    mine = slice(rank * STEP_ROWS, (rank + 1) * STEP_ROWS)
    device, mode = os.environ[DEVICE_ENV], os.environ[EXCHANGE_ENV]
    weights, accumulators, losses, sent = _train_steps(
        mine,
        DistributedDataParallel,
        device,
        mode,
        world_size,  # type: ignore[arg-type]
    )
    for mine_ in (weights, accumulators):
        gathered = [torch.empty_like(mine_) for _ in range(world_size)]
        dist.all_gather(gathered, mine_)
        for other in gathered[1:]:
            torch.testing.assert_close(other, gathered[0], rtol=0, atol=0)  # bit for bit
    every = torch.tensor(losses)
    dist.all_reduce(every)
    one_weights, one_accumulators, one_losses = torch.load(os.environ[ONE_RANK_ENV])
    torch.testing.assert_close(every / world_size, one_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, one_weights, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(accumulators, one_accumulators, rtol=1e-4, atol=1e-5)
    assert all(bytes_ > 0 for bytes_ in sent)  # the touched rows travelled every step


@pytest.mark.parametrize(
    ("mode", "world_size", "device"),
    [
        ("union", 2, "cpu"),
        ("union", 4, "cpu"),
        ("sparse", 2, "cpu"),
        pytest.param("union", 2, "cuda", marks=pytest.mark.gpu),
        pytest.param("sparse", 2, "cuda", marks=pytest.mark.gpu),
    ],
)
def test_ranks_train_twenty_steps_as_one_rank_on_all_their_rows(
    mode: str, world_size: int, device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the ranks share device 0 over gloo (NCCL refuses two ranks on one device)."""
    monkeypatch.setenv(DEVICE_ENV, device)
    monkeypatch.setenv(EXCHANGE_ENV, mode)
    one_rank = _train_steps(slice(None), lambda module: module, device, mode, world_size)  # type: ignore[arg-type]
    weights, accumulators, losses, sent = one_rank
    assert set(sent) == {0}  # one rank sends nothing
    torch.save((weights, accumulators, torch.tensor(losses)), tmp_path / "one_rank.pt")
    monkeypatch.setenv(ONE_RANK_ENV, str(tmp_path / "one_rank.pt"))
    _run_on_ranks(_ranks_train_as_one, world_size)


if __name__ == "__main__":
    _fork_ranks(globals()[sys.argv[1]], int(sys.argv[2]))
