"""Whether the softmax rows' exchange hides behind the backward: real gloo ranks on this machine's
CPUs, the union exchange launched from the softmax's gradients against the same exchange after
the backward, taking turns.

    python -m benchmarks.bench_exchange [--workers 2,4] [--preset tiny] [--rows 32]
    python -m benchmarks.bench_exchange --smoke        # tiny sizes, 2 ranks

Each rank trains the same model (`tiny` with `original`'s 512-wide softmax by default, over
200,000 rows with `original`'s 8,192 candidates a direction, so that the exchange is of a real
size, the rest of the step small enough for a CPU, and two models a rank fit 4 ranks' memory) on
synthetic Zipf windows through DDP and ``TrainingStep``, one step built each way. Printed per
world size: the serial step, the overlapped one, the time the overlap saved, and the exchange's
own time (its all-reduce alone, waited for). A 2-core machine shows whether the overlap happens,
not a GPU's speed. Last line: one JSON object. Results: benchmarks/results/bench_exchange-*.md.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from benchmarks.harness import print_summary, seconds_per_call, time_in_turn
from benchmarks.ranks import on_gloo_ranks
from benchmarks.workload import found_ahead, synthetic_windows, worker_step
from elmo_core.config import TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.presets import model_preset
from elmo_core.training.gradient_exchange import agree_on_rows, reduce_rows_over_union
from elmo_core.training.step import TrainingStep

VOCAB, NUM_SAMPLES, WINDOW, TYPES = 200_000, 8_192, 20, 5_000


def measure(rank: int, args: argparse.Namespace) -> dict[str, float]:
    """This rank's serial and overlapped steps, in turns, and the exchange alone."""
    torch.set_num_threads(1)  # the ranks share the machine's cores
    preset = model_preset(args.preset)
    lstm = preset.lstm.model_copy(update={"projection_dim": args.projection})
    config = preset.model_copy(update={"num_samples": args.samples, "lstm": lstm})
    runs, steps = {}, {}
    for name, overlap in (("serial", False), ("overlapped", True)):
        torch.manual_seed(0)
        bilm = BiLM(config, args.vocab).train()
        recipe = TrainConfig(batch_size=args.rows, unroll_steps=WINDOW, bf16=False)
        steps[name] = TrainingStep.build(
            bilm, recipe, "union", DistributedDataParallel, overlap_exchange=overlap
        )
        windows, types, targets = synthetic_windows(
            args.rows, WINDOW, args.vocab, args.types, config.char_cnn.max_chars_per_token,
            torch.device("cpu"),
        )  # fmt: skip
        assert bilm.softmax is not None
        ahead = found_ahead(bilm.softmax, targets, pinned=False)
        runs[name] = worker_step(steps[name], windows, types, targets, ahead)
    seconds = time_in_turn(runs, args.repeats, warmup=1)
    found = ahead[1][0]
    union = agree_on_rows(found, args.vocab)
    rows = torch.randn(found.numel(), config.lstm.projection_dim + 1)
    exchange = seconds_per_call(lambda: reduce_rows_over_union(found, rows, union), args.repeats)
    return seconds | {"exchange": exchange, "union_rows": float(union.numel())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument(
        "--projection", type=int, default=512, help="the softmax's width: original's 512"
    )
    parser.add_argument("--rows", type=int, default=32, help="rows a rank")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--samples", type=int, default=NUM_SAMPLES)
    parser.add_argument("--types", type=int, default=TYPES)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 2 ranks")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workers, args.preset, args.rows, args.vocab = "2", "tiny", 4, 2_000
        args.projection = 16
        args.samples, args.types, args.repeats = 64, 50, 2
    summary: dict[str, object] = {"benchmark": "exchange", "preset": args.preset, "rows": args.rows}
    print(f"union exchange, {args.preset}, {args.rows} rows a rank, K = {args.samples:,}")
    print(
        f"{'ranks':>5} {'union rows':>11} {'serial s':>9} {'overlapped s':>13} {'saved s':>8} "
        f"{'exchange s':>11}"
    )
    for world in (int(value) for value in args.workers.split(",")):
        figures = on_gloo_ranks(measure, world, args)[0]
        saved = figures["serial"] - figures["overlapped"]
        print(
            f"{world:5} {figures['union_rows']:11,.0f} {figures['serial']:9.3f} "
            f"{figures['overlapped']:13.3f} {saved:8.3f} {figures['exchange']:11.3f}"
        )
        summary |= {f"{name}@{world}": round(value, 6) for name, value in figures.items()}
        summary[f"saved_over_exchange@{world}"] = round(saved / figures["exchange"], 3)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
