"""What ``train.shape_buckets`` costs and how many CUDA graphs a captured run makes, on real text.

    python -m benchmarks.bench_shape_buckets [--corpus ptb|python-docs] [--steps 400]
    python -m benchmarks.bench_shape_buckets --smoke     # the bundled corpus, a few steps

Reads PTB (or the bundled ``python-docs`` corpus) through the training loader, as a worker does,
at 128 and 1,024 rows × 20 with ``original``'s draw (8,192 candidates of 793,471 rows), once with
exact shapes (the baseline) and once bucketed. Printed per row count: the distinct shapes each way
(a captured step makes one graph per bucketed shape), the step by which every bucketed shape had
appeared, and the bucketed work over the exact: the char CNN's multiply-adds (convolutions over
the columns each cut keeps, highway, projection) and the softmax rows'. Last line: one JSON
object. Results: benchmarks/results/bench_shape_buckets-2026-11-28.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_data_path import ORIGINAL_DRAW
from benchmarks.bench_eval_protocols import prepare_benchmark_corpus
from benchmarks.harness import print_summary
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.presets import model_preset
from elmo_core.training.batches import StepBatch, StepBatches, StreamSpec

REPO = Path(__file__).resolve().parents[1]
CNN = model_preset("original").char_cnn
MAX_WIDTH = max(width for width, _ in CNN.filters)
# per type: the highway layers and the projection, whatever its width
PER_TYPE_MACS = 2 * CNN.num_highway * CNN.num_filters**2 + CNN.num_filters * 512


def shape(batch: StepBatch) -> tuple[int, int, int]:
    """What sets a step's graph: its types, their used width and its softmax rows."""
    assert batch.softmax_rows is not None
    return len(batch.types.char_ids), batch.types.used_width, len(batch.softmax_rows)


def cnn_macs(batch: StepBatch) -> int:
    """The char CNN's multiply-adds at ``original``: each type's convolutions over the columns
    its cut keeps, its highway layers and its projection."""
    types, used_width = len(batch.types.char_ids), batch.types.used_width
    columns = min(batch.types.char_ids.shape[1], used_width + MAX_WIDTH)
    convolutions = sum(
        num * width * CNN.embedding_dim * max(0, columns - width + 1) for width, num in CNN.filters
    )
    return types * (convolutions + PER_TYPE_MACS)


def shapes_over(dataset: str, rows: int, unroll: int, steps: int, buckets: bool) -> list[StepBatch]:
    manifest = load_manifest(dataset)
    table = load_word_types(dataset, manifest).char_ids
    specs = (
        StreamSpec(dataset, rows, unroll, 0, 1, False, 1, candidates=ORIGINAL_DRAW),
        StreamSpec(dataset, rows, unroll, 0, 1, True, 2, candidates=ORIGINAL_DRAW),
    )
    with StepBatches(
        specs, manifest, table, workers=0, pin_memory=False, shape_buckets=buckets
    ) as batches:
        return [next(batches) for _ in range(steps)]


def compare(dataset: str, rows: int, unroll: int, steps: int) -> dict[str, float | int]:
    """The bucketed steps against the exact ones, on the same windows."""
    exact = shapes_over(dataset, rows, unroll, steps, buckets=False)
    bucketed = shapes_over(dataset, rows, unroll, steps, buckets=True)
    seen: set[tuple[int, int, int]] = set()
    last_new = 0
    for number, batch in enumerate(bucketed, start=1):
        if shape(batch) not in seen:
            seen.add(shape(batch))
            last_new = number
    return {
        "shapes_exact": len({shape(batch) for batch in exact}),
        "shapes_bucketed": len(seen),
        "last_new_shape_at_step": last_new,
        "cnn_work_ratio": round(sum(map(cnn_macs, bucketed)) / sum(map(cnn_macs, exact)), 4),
        "softmax_rows_ratio": round(
            sum(shape(b)[2] for b in bucketed) / sum(shape(b)[2] for b in exact), 4
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=["ptb", "python-docs"], default="ptb")
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--rows", default="128,1024")
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--smoke", action="store_true", help="python-docs, 8 rows, 12 steps")
    args = parser.parse_args(argv)
    if args.smoke:
        args.corpus, args.rows, args.steps = "python-docs", "8", 12
    ptb = args.data_root / "ptb"
    if args.corpus == "ptb" and not ptb.is_dir():
        print_summary({"benchmark": "shape_buckets", "skipped": f"no PTB under {args.data_root}"})
        return 0
    summary: dict[str, object] = {"benchmark": "shape_buckets", "corpus": args.corpus}
    with tempfile.TemporaryDirectory(prefix="bench-shape-buckets-") as scratch:
        dataset = prepare_benchmark_corpus(args.corpus, ptb, Path(scratch), 100)
        print(f"shape buckets, {args.corpus}, {args.steps} steps × {args.unroll}, K = 8,192")
        print(
            f"{'rows':>6} {'shapes exact':>13} {'bucketed':>9} {'all by step':>12} "
            f"{'CNN work':>9} {'softmax rows':>13}"
        )
        for rows in (int(value) for value in args.rows.split(",")):
            figures = compare(dataset, rows, args.unroll, args.steps)
            print(
                f"{rows:6} {figures['shapes_exact']:13} {figures['shapes_bucketed']:9} "
                f"{figures['last_new_shape_at_step']:12} {figures['cnn_work_ratio']:8.3f}x "
                f"{figures['softmax_rows_ratio']:12.3f}x"
            )
            summary |= {f"{name}@{rows}": value for name, value in figures.items()}
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
