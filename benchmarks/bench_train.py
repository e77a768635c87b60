"""Training throughput: Ray worker scaling, the softmax-gradient exchange, and the data path.

    python -m benchmarks.bench_train [--data-root ../shared/data] [--steps 40] [--vocab 100000]

Three measurements, each against a baseline from the same run: the softmax gradient's dense
all-reduce against the sparse row exchange (2 gloo processes), the real train stage with 1 and 2
Ray workers on PTB, and the data path against what one training worker consumes. Last line: one
JSON object; ``ratio = dense_seconds / sparse_seconds`` of the exchange. Method and results:
benchmarks/results/bench_train-2026-11-21.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.bench_data_path import measure as measure_data_path
from benchmarks.bench_eval_protocols import prepare_ptb, small_config
from benchmarks.harness import print_summary
from elmo_core.config import TrainConfig
from elmo_core.model.sampler import LogUniformSampler
from elmo_core.training.gradient_exchange import exchange_softmax_gradients
from pipelines.train.job_config import RunConfig, TrainJobConfig

REPO = Path(__file__).resolve().parents[1]

BATCH_SIZE, UNROLL_STEPS = 32, 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--steps", type=int, default=40, help="training steps per Ray run")
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--num-samples", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


# --- exchange: 2 gloo processes ------------------------------------------------------------------


def _exchange_rank(rank: int, port: int, args: argparse.Namespace, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    generator = torch.Generator().manual_seed(rank)
    sampler = LogUniformSampler(args.vocab)
    rows = torch.cat(
        [
            sampler.sample_unique(args.num_samples, generator)[0],  # (K,) candidates
            sampler.draw(BATCH_SIZE * UNROLL_STEPS, generator),  # (B·T,) Zipf-like targets
        ]
    )
    values = torch.randn(rows.numel(), args.dim, generator=generator)  # (R, P)
    bound = rows.numel()  # every rank's: the static size the rows are padded to
    weight = torch.nn.Parameter(torch.zeros(args.vocab, args.dim))
    bias = torch.nn.Parameter(torch.zeros(args.vocab))

    def fresh_grads() -> None:
        weight.grad = torch.sparse_coo_tensor(
            rows.unsqueeze(0), values, weight.shape, check_invariants=False
        )
        bias.grad = torch.zeros(args.vocab).index_add_(0, rows, values[:, 0])

    timings: dict[str, list[float]] = {}
    sent: dict[str, int] = {}
    for mode in ("dense", "sparse"):
        fresh_grads()
        sent[mode] = exchange_softmax_gradients(weight, bias, mode, bound)  # warm-up, the check
        if mode == "dense":
            reference = weight.grad.clone()
        else:
            assert torch.allclose(weight.grad.to_dense(), reference, atol=1e-5)
        timings[mode] = []
        for _ in range(args.repeats):
            fresh_grads()
            dist.barrier()
            started = time.perf_counter()
            exchange_softmax_gradients(weight, bias, mode, bound)
            timings[mode].append(time.perf_counter() - started)
    if rank == 0:
        results.put({mode: (statistics.median(t), sent[mode]) for mode, t in timings.items()})
    dist.destroy_process_group()


def measure_exchange(args: argparse.Namespace) -> dict[str, tuple[float, int]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("fork")
    results = context.Queue()
    mp.start_processes(_exchange_rank, args=(port, args, results), nprocs=2, start_method="fork")
    return results.get()


# --- scaling and data path: the real train stage on PTB ------------------------------------------


def train_config(workers: int, steps: int, storage: Path) -> TrainJobConfig:
    return TrainJobConfig(
        model=small_config(),
        train=TrainConfig(
            max_steps=steps,
            batch_size=BATCH_SIZE,
            unroll_steps=UNROLL_STEPS,
            log_every=5,
            checkpoint_every=10 * steps,
            validate_every=10 * steps,
            validation_sentences=20,
        ),
        run=RunConfig(num_workers=workers, storage_path=str(storage), name=f"bench-{workers}w"),
    )


def training_tokens_per_s(dataset: str, workers: int, steps: int, storage: Path) -> float:
    """Median logged in-loop throughput of a real Ray Train run (first log window dropped)."""
    from mlflow.tracking import MlflowClient

    from pipelines.tracking.flow_runs import TOKENS_PER_S_METRIC
    from pipelines.tracking.stage_runs import use_tracking
    from pipelines.train.stage import train

    result = train(train_config(workers, steps, storage), dataset)
    history = MlflowClient(use_tracking()).get_metric_history(
        result.mlflow_run_id, TOKENS_PER_S_METRIC
    )
    values = [m.value for m in sorted(history, key=lambda m: m.step)][1:]
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exchange = measure_exchange(args)
    (dense_s, dense_bytes), (sparse_s, sparse_bytes) = exchange["dense"], exchange["sparse"]
    summary: dict[str, object] = {
        "benchmark": "train",
        "vocab": args.vocab,
        "dim": args.dim,
        "dense_exchange_s": dense_s,
        "sparse_exchange_s": sparse_s,
        "dense_bytes_per_step": dense_bytes,
        "sparse_bytes_per_step": sparse_bytes,
        "ratio": dense_s / sparse_s,
    }
    print(f"{'softmax gradient exchange (2 gloo ranks)':44s} {'seconds':>10s} {'MB sent':>10s}")
    for name, (seconds, sent) in exchange.items():
        print(f"  {name:42s} {seconds:10.4f} {sent / 2**20:10.2f}")
    ptb = args.data_root / "ptb"
    if ptb.is_dir():
        summary.update(measure_training(ptb, args))
    else:
        print(f"skipping training and data path: no PTB under {args.data_root}")
    print_summary(summary)
    return 0


def measure_training(ptb: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-train-") as scratch:
        work = Path(scratch)
        os.environ.setdefault("ELMO_HOME", str(work / "home"))
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        dataset = prepare_ptb(ptb, work)
        from pipelines.common.ray_cluster import connect_ray

        connect_ray(num_cpus=2)
        one = training_tokens_per_s(dataset, 1, args.steps, work / "runs")
        two = training_tokens_per_s(dataset, 2, args.steps, work / "runs")
        data, _ = measure_data_path(dataset, BATCH_SIZE, UNROLL_STEPS, workers=0, steps=200)
    print(f"{'training (Ray Train, CPU, small model)':44s} {'tokens/s':>10s}")
    print(f"  {'1 worker':42s} {one:10.0f}")
    print(f"  {'2 workers':42s} {two:10.0f}   scaling {two / one:.2f}x")
    print(f"  {'data path alone (1 worker)':42s} {data:10.0f}   {data / one:.1f}x training")
    return {
        "train_tokens_per_s_1": one,
        "train_tokens_per_s_2": two,
        "scaling": two / one,
        "data_tokens_per_s": data,
        "data_over_training": data / one,
    }


if __name__ == "__main__":
    raise SystemExit(main())
