"""Two data-parallel ranks training `original` on one device, over gloo: what each rank sends a
step (the dense gradients DDP all-reduces, the softmax rows apart), what each exchange takes
alone (the rows' union all-reduced, the default; the padded rows all-gathered; the host's
agreement on the union), and the gathered rows' summing on the device at 2, 8 and 16 workers
(the part of the gather's exchange that grows with the world). Both ranks share CUDA device 0, as
NCCL refuses two ranks on one device, so the step and exchange times are gloo's through the host,
not a link's: the bytes and the summing's time are what ``scaling_model.py`` takes from here.

    python -m infra.device.two_ranks                # original, 128 rows a rank, CUDA device 0
    python -m infra.device.two_ranks --smoke        # tiny sizes on the CPU (tested in CI)

Last line: one JSON object. Exits 1 when the ranks end with different weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from benchmarks.harness import print_summary
from benchmarks.ranks import on_gloo_ranks
from benchmarks.workload import found_ahead, synthetic_windows, worker_step
from elmo_core.config import TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.sampler import LogUniformSampler
from elmo_core.presets import model_preset
from elmo_core.training.gradient_exchange import (
    agree_on_rows,
    dense_gradient_bytes,
    exchange_rows,
    reduce_rows_over_union,
    softmax_rows_bound,
    sum_rows_by_id,
)
from elmo_core.training.step import TrainingStep

WORLD_SIZE = 2
SUMMING_WORLDS = (2, 8, 16)  # workers whose gathered rows one worker sums
REPEATS = 5  # timed calls of each exchange alone


def median_seconds(
    run: Callable[[], object], repeats: int, synchronize: Callable[[], None]
) -> float:
    """Median wall seconds of ``run``, the device drained before each clock read; one untimed
    call first."""
    run()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rank: int, args: argparse.Namespace) -> dict[str, Any]:
    """This rank's step and exchanges; every rank must call it (the collectives pair up)."""
    device = torch.device(args.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    config = model_preset(args.preset).model_copy(
        update={"lstm_impl": args.lstm_impl, "batch_directions": True}
    )
    torch.manual_seed(0)
    model = BiLM(config, args.vocab).to(device).train()
    windows, types, host_targets = synthetic_windows(
        args.batch, args.window, args.vocab, args.types, config.char_cnn.max_chars_per_token, device
    )
    recipe = TrainConfig(
        batch_size=args.batch, unroll_steps=args.window, bf16=device.type == "cuda"
    )
    step = TrainingStep.build(model, recipe, "union", DistributedDataParallel)
    assert model.softmax is not None
    ahead = found_ahead(model.softmax, host_targets, pinned=device.type == "cuda")
    run = worker_step(step, windows, types, host_targets, ahead)
    sent = run().softmax_bytes  # the first step: compiles and lazy state, untimed
    step_s = median_seconds(run, args.steps, synchronize)

    dense_bytes = dense_gradient_bytes(model)  # what DDP all-reduces
    flat = torch.randn(dense_bytes // 4, device=device)
    all_reduce_s = median_seconds(lambda: dist.all_reduce(flat), REPEATS, synchronize)

    bound = softmax_rows_bound(args.vocab, args.batch, args.window, config.num_samples)
    width = config.lstm.projection_dim + 1  # a row's weight and bias, as they travel
    sampler, generator = LogUniformSampler(args.vocab), torch.Generator().manual_seed(rank)
    found = ahead[1][0]  # (R,) on the host: the rows the first step touched, as the loader finds
    agree_s = median_seconds(lambda: agree_on_rows(found, args.vocab), REPEATS, synchronize)
    union = agree_on_rows(found, args.vocab).to(device)
    ids = found.to(device)
    rows = torch.randn(ids.numel(), width, device=device)
    union_s = median_seconds(lambda: reduce_rows_over_union(ids, rows, union), REPEATS, synchronize)
    rows_s = median_seconds(
        lambda: exchange_rows(ids, rows, args.vocab, bound), REPEATS, synchronize
    )

    summing_s = {}
    for world in SUMMING_WORLDS:  # the gathered rows one worker receives, summed on its device
        gathered_ids = sampler.draw(world * bound, generator).to(device)
        gathered = torch.randn(world * bound, width, device=device)
        summing_s[world] = median_seconds(
            lambda i=gathered_ids, r=gathered: sum_rows_by_id(i, r, args.vocab),
            REPEATS,
            synchronize,
        )

    weights = torch.cat([p.detach().flatten().float() for p in model.parameters()]).cpu()
    everyone = [torch.empty_like(weights) for _ in range(WORLD_SIZE)]
    dist.all_gather(everyone, weights)
    return {
        "rank": rank,
        "step_ms": step_s * 1e3,
        "dense_bytes": dense_bytes,
        "softmax_bytes": sent,
        "softmax_rows": ids.numel(),
        "union_rows": union.numel(),
        "softmax_rows_bound": bound,
        "all_reduce_ms": all_reduce_s * 1e3,
        "agree_ms": agree_s * 1e3,
        "union_exchange_ms": union_s * 1e3,
        "gather_exchange_ms": rows_s * 1e3,
        "sum_rows_ms": {str(world): seconds * 1e3 for world, seconds in summing_s.items()},
        "weights_equal": all(torch.equal(everyone[0], other) for other in everyone[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--batch", type=int, default=128, help="rows per rank")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=793_471)
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    parser.add_argument("--lstm-impl", default="fused", choices=["reference", "fused"])
    parser.add_argument("--device", help="default cuda:0 where there is one, else cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a CPU check")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.batch, args.window, args.vocab, args.types = "tiny", 4, 5, 200, 50
        args.steps = 2
    args.device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    ranks = on_gloo_ranks(measure, WORLD_SIZE, args)
    print(f"{WORLD_SIZE} gloo ranks on {args.device}: {args.preset}, {args.batch} rows a rank")
    print(
        f"{'rank':>4} {'step ms':>9} {'dense MiB':>10} {'rows MiB':>9} {'all-reduce ms':>14} "
        f"{'agree ms':>9} {'union ms':>9} {'gather ms':>10}"
    )
    for r in ranks:
        print(
            f"{r['rank']:>4} {r['step_ms']:9.2f} {r['dense_bytes'] / 2**20:10.2f} "
            f"{r['softmax_bytes'] / 2**20:9.2f} {r['all_reduce_ms']:14.2f} "
            f"{r['agree_ms']:9.2f} {r['union_exchange_ms']:9.2f} {r['gather_exchange_ms']:10.2f}"
        )
    summing = ranks[0]["sum_rows_ms"]
    print(
        "the gathered rows summed, ms on one worker: "
        + ", ".join(f"{world} workers {ms:.2f}" for world, ms in summing.items())
    )
    weights_equal = all(r["weights_equal"] for r in ranks)
    print(f"both ranks hold the same weights: {weights_equal}")
    print_summary(
        {
            "device": args.device,
            "preset": args.preset,
            "batch": args.batch,
            "world_size": WORLD_SIZE,
            "ranks": ranks,
            "weights_equal": weights_equal,
        }
    )
    return 0 if weights_equal else 1


if __name__ == "__main__":
    sys.exit(main())
