"""How data-parallel training scales, PREDICTED: the bytes a step exchanges (counted here at the
model's sizes, and checked by two ranks on a GPU) against link rates, with measured step times and
the measured device work of summing the gathered rows, for one node of 8 GPUs over NVLink and for
2 nodes of 8 over 400 Gb/s. A model to check on GPUs, not a measurement.

    python -m infra.device.scaling_model [--preset original] [--rows 128,1024] [--gpu h100]

Last line: one JSON object; results in benchmarks/results/scaling_model-2026-11-28.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from elmo_core.model.bilm import BiLM
from elmo_core.presets import model_preset
from elmo_core.training.gradient_exchange import SOFTMAX_PARAMETERS, softmax_rows_bound

VOCAB, WINDOW = 793_471, 20  # the 1B Word Benchmark's vocabulary; gpu_bilm's window
# A graphed step of `original` (what each of several workers runs), positions/s at 128 and 1,024
# rows: on an H100 (issue 46, tree 6f3199c), and on an H200 (issue 54, the median of 3 runs).
MEASURED_POSITIONS_PER_S = {
    "h100": {128: 156_000, 1024: 358_000},
    "h200": {128: 139_100, 1024: 406_400},
}
# Summing the gathered rows into their union (sort, gather, index_add), measured on an H200 by
# infra/device/two_ranks.py: 16 workers' padded rows at 128 rows (16 × 42.2 MiB) in 5.54 ms, and
# 8 workers' in 2.80 ms. Bytes of gathered rows a second; every worker does it after the gather.
UNION_BYTES_PER_S = 16 * 44_298_240 / 5.54e-3
# Assumed link rates, bytes/s per GPU: NCCL's bus bandwidth inside an NVLink node, and one
# 400 Gb/s NIC per GPU between nodes. Both are datasheet-level guesses, to be measured.
NVLINK = 400e9
NETWORK = 50e9
BACKWARD_SHARE = 2 / 3  # of a step: what DDP's bucketed all-reduce can hide behind


@dataclass(frozen=True)
class Cluster:
    gpus_per_node: int
    nodes: int

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


def dense_bytes(preset: str) -> int:
    """The float32 gradients DDP all-reduces each step: every parameter but the softmax's."""
    with torch.device("meta"):
        bilm = BiLM(model_preset(preset), VOCAB)
    return sum(
        p.numel() * p.element_size()
        for name, p in bilm.named_parameters()
        if name not in SOFTMAX_PARAMETERS
    )


def sparse_bytes(preset: str, rows: int) -> int:
    """The softmax rows one worker sends in a step: as many as a step can touch (both
    directions' targets and candidates), the static size every worker pads to so that nothing is
    read back (``softmax_rows_bound``), each ``P + 1`` float32 (weight and bias) and an int64
    id."""
    config = model_preset(preset)
    bound = softmax_rows_bound(VOCAB, rows, WINDOW, config.num_samples)
    return bound * ((config.lstm.projection_dim + 1) * 4 + 8)


def exchange_seconds(dense: int, sparse: int, cluster: Cluster) -> tuple[float, float, float]:
    """Seconds of the dense all-reduce (ring in the node, then across nodes on each GPU's share),
    of the sparse rows' all-gather (every other worker's rows received), and of summing all the
    gathered rows into their union on the device."""
    g, n = cluster.gpus_per_node, cluster.nodes
    all_reduce = 2 * (g - 1) / g * dense / NVLINK + 2 * (n - 1) / n * (dense / g) / NETWORK
    all_gather = (g - 1) * sparse / NVLINK + (n - 1) * g * sparse / NETWORK
    union = cluster.world * sparse / UNION_BYTES_PER_S if cluster.world > 1 else 0.0
    return all_reduce, all_gather, union


def efficiency(
    step_s: float, dense_s: float, sparse_s: float, union_s: float
) -> tuple[float, float]:
    """Scaling efficiency with the exchange after the step, and with the dense all-reduce hidden
    behind the backward as far as it lasts (the rows' gather and union go after it, as now)."""
    exposed = max(0.0, dense_s - BACKWARD_SHARE * step_s)
    rows = sparse_s + union_s
    return step_s / (step_s + dense_s + rows), step_s / (step_s + exposed + rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--rows", default="128,1024", help="rows per GPU, with measured steps")
    parser.add_argument(
        "--gpu", default="h100", choices=sorted(MEASURED_POSITIONS_PER_S), help="whose step times"
    )
    args = parser.parse_args(argv)
    dense = dense_bytes(args.preset)
    clusters = {"8 GPUs, NVLink": Cluster(8, 1), "2 x 8 GPUs, 400 Gb/s": Cluster(8, 2)}
    print(f"PREDICTED data-parallel scaling of {args.preset} on {args.gpu} (a model; see --help)")
    print(f"dense gradients all-reduced per step: {dense / 2**20:.1f} MiB")
    summary: dict[str, object] = {"preset": args.preset, "gpu": args.gpu, "dense_bytes": dense}
    for rows in (int(value) for value in args.rows.split(",")):
        sparse = sparse_bytes(args.preset, rows)
        step_s = rows * WINDOW / MEASURED_POSITIONS_PER_S[args.gpu][rows]
        sent = f"{sparse / 2**20:.1f} MiB of softmax rows sent"
        print(f"{rows} rows: {sent}, step {step_s * 1e3:.1f} ms")
        summary[f"sparse_bytes@{rows}"] = sparse
        for name, cluster in clusters.items():
            dense_s, sparse_s, union_s = exchange_seconds(dense, sparse, cluster)
            after, overlapped = efficiency(step_s, dense_s, sparse_s, union_s)
            print(
                f"  {name:22} all-reduce {dense_s * 1e3:5.1f} ms, rows {sparse_s * 1e3:5.1f} ms, "
                f"union {union_s * 1e3:4.1f} ms: "
                f"efficiency {after:.0%} after the step, {overlapped:.0%} overlapped"
            )
            summary[f"{name}@{rows}"] = {
                "all_reduce_ms": round(dense_s * 1e3, 2),
                "rows_ms": round(sparse_s * 1e3, 2),
                "union_ms": round(union_s * 1e3, 2),
                "efficiency": round(after, 3),
                "efficiency_overlapped": round(overlapped, 3),
            }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
