"""How data-parallel training scales, PREDICTED, for each way the softmax's row gradients can
travel: the bytes a step exchanges (counted here at the model's sizes; the rows touched counted
on real text by ``benchmarks/bench_softmax_rows.py``) against link rates, with measured step times
and the measured device work of summing gathered rows, for one node of 8 GPUs over NVLink and for
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
from elmo_core.training.gradient_exchange import dense_gradient_bytes, softmax_rows_bound

VOCAB, WINDOW = 793_471, 20  # the 1B Word Benchmark's vocabulary; gpu_bilm's window
# A graphed step of `original` (what each of several workers runs), positions/s at 128 and 1,024
# rows: on an H100 (the lent H100's first measurement of the graphed step, tree 6f3199c), and on
# an H200 (the lent H200's, the median of 3 runs); `--positions-per-s` gives others.
MEASURED_POSITIONS_PER_S = {
    "h100": {128: 156_000, 1024: 358_000},
    "h200": {128: 139_100, 1024: 406_400},
}
# Summing gathered rows by id (sort, gather, index_add), measured on an H200 by
# infra/device/two_ranks.py: 16 workers' padded rows at 128 rows (16 × 42.2 MiB) in 5.54 ms, and
# 8 workers' in 2.80 ms. Bytes of gathered rows a second.
SUM_ROWS_BYTES_PER_S = 16 * 44_298_240 / 5.54e-3
# The distinct softmax rows a step touches, the mean over 6 steps of PTB and the books read by
# each worker's own loader with original's draw (benchmarks/bench_softmax_rows.py): one worker's,
# and all workers' together at 8 and 16 workers, each drawing its own candidates.
ROWS_TOUCHED = {
    128: {1: 15_240, 8: 79_430, 16: 132_422},
    1024: {1: 17_932, 8: 82_639, 16: 134_579},
}
# Assumed link rates, bytes/s per GPU: NCCL's bus bandwidth inside an NVLink node, and one
# 400 Gb/s NIC per GPU between nodes. Both are datasheet-level guesses, to be measured.
NVLINK = 400e9
NETWORK = 50e9
HBM = 3e12  # bytes/s a plain fill or copy moves on the device
# The host's network for the union's agreement (gloo over TCP, a byte a vocabulary row): an
# assumed 10 Gb/s and 25 µs a ring step.
HOST_NETWORK, HOST_LATENCY = 1.25e9, 25e-6
BACKWARD_SHARE = 2 / 3  # of a step: what DDP's bucketed all-reduce can hide behind
# Of the backward, what comes after the softmax's gradients exist (the LSTMs', highway's and
# char CNN's): what an exchange launched from them could hide behind. An assumption.
AFTER_SOFTMAX_SHARE = 3 / 4
# Where the host binds a multi-worker (graphed) step, host work in it is exposed: at 128 rows
# the GPU waits for the host; at 1,024 it is busy 97 % of a step (gpu_graphed-2026-11-27.md).
HOST_BOUND = {128: True, 1024: False}


@dataclass(frozen=True)
class Cluster:
    gpus_per_node: int
    nodes: int

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Cost:
    """One exchange of a step, in seconds: on the links, on the device, on the host; and whether
    its link time can hide behind the backward after the softmax's gradients."""

    link: float
    device: float = 0.0
    host: float = 0.0
    overlapped: bool = False


def dense_bytes(preset: str) -> int:
    """The float32 gradients DDP all-reduces each step: every parameter but the softmax's."""
    with torch.device("meta"):
        return dense_gradient_bytes(BiLM(model_preset(preset), VOCAB))


def sparse_bytes(preset: str, rows: int) -> int:
    """The softmax rows one worker sends in a step: as many as a step can touch (both
    directions' targets and candidates), the static size every worker pads to so that nothing is
    read back (``softmax_rows_bound``), each ``P + 1`` float32 (weight and bias) and an int64
    id."""
    config = model_preset(preset)
    bound = softmax_rows_bound(VOCAB, rows, WINDOW, config.num_samples)
    return bound * ((config.lstm.projection_dim + 1) * 4 + 8)


def all_reduce_seconds(size: int, cluster: Cluster) -> float:
    """A ring in the node, then across nodes on each GPU's share of ``size`` bytes."""
    g, n = cluster.gpus_per_node, cluster.nodes
    return 2 * (g - 1) / g * size / NVLINK + 2 * (n - 1) / n * (size / g) / NETWORK


def all_gather_seconds(size: int, cluster: Cluster) -> float:
    """Every other worker's ``size`` bytes received, the other nodes' through this GPU's NIC."""
    g, n = cluster.gpus_per_node, cluster.nodes
    return (g - 1) * size / NVLINK + (n - 1) * g * size / NETWORK


def all_to_all_seconds(size: int, cluster: Cluster) -> float:
    """A ``W``-th of ``size`` bytes to each other worker, the other nodes' through the NIC."""
    g, n, w = cluster.gpus_per_node, cluster.nodes, cluster.world
    return (g - 1) * size / w / NVLINK + g * (n - 1) * size / w / NETWORK


def exchange_seconds(dense: int, sparse: int, cluster: Cluster) -> tuple[float, float, float]:
    """Today's padded gather, in seconds: the dense all-reduce, the rows' all-gather, and summing
    all the gathered rows on the device."""
    if cluster.world == 1:
        return 0.0, 0.0, 0.0
    summing = cluster.world * sparse / SUM_ROWS_BYTES_PER_S
    return all_reduce_seconds(dense, cluster), all_gather_seconds(sparse, cluster), summing


def designs(preset: str, rows: int, cluster: Cluster) -> dict[str, Cost]:
    """Each way the softmax rows can travel, priced for ``rows`` rows a GPU on ``cluster``."""
    config = model_preset(preset)
    width = config.lstm.projection_dim + 1  # weight and bias, float32
    padded = sparse_bytes(preset, rows)
    touched, union = ROWS_TOUCHED[rows][1], ROWS_TOUCHED[rows][cluster.world]
    _, gather, summing = exchange_seconds(0, padded, cluster)
    block = union * width * 4  # the union's rows, in the order the workers agreed: no ids
    agree = (
        2 * (cluster.world - 1) * HOST_LATENCY
        + 2 * (cluster.world - 1) / cluster.world * VOCAB / HOST_NETWORK
    )
    hidden = 2 * rows * WINDOW * config.lstm.projection_dim * 2  # both directions', bf16
    return {
        "gather (before)": Cost(gather, summing),
        "gather, overlapped": Cost(gather, summing, overlapped=True),
        "union all-reduce, after": Cost(
            all_reduce_seconds(block, cluster),
            (block + touched * width * 4) / HBM,
            agree if HOST_BOUND[rows] else 0.0,
        ),
        "union all-reduce, overlapped (built)": Cost(
            all_reduce_seconds(block, cluster),
            (block + touched * width * 4) / HBM,
            agree if HOST_BOUND[rows] else 0.0,
            overlapped=True,
        ),
        "owners reduce, then gather": Cost(
            all_to_all_seconds(touched * (width * 4 + 8), cluster)
            + all_gather_seconds(union // cluster.world * (width * 4 + 8), cluster),
            touched * width * 4 / SUM_ROWS_BYTES_PER_S,
            agree if HOST_BOUND[rows] else 0.0,  # the counts, agreed on the host to size it
        ),
        "vocabulary-parallel softmax": Cost(2 * all_gather_seconds(hidden, cluster)),
    }


def efficiency(step_s: float, dense_s: float, cost: Cost) -> tuple[float, float]:
    """Scaling efficiency with every exchange after the backward, and with DDP's all-reduce
    hidden behind the backward as far as it lasts (and the rows' link time with it, in a design
    that launches them from the softmax's gradients). Device and host time is never hidden."""
    after = step_s / (step_s + dense_s + cost.link + cost.device + cost.host)
    window = BACKWARD_SHARE * step_s
    if cost.overlapped:
        window *= AFTER_SOFTMAX_SHARE
        exposed = max(0.0, dense_s + cost.link - window)
    else:
        exposed = max(0.0, dense_s - window) + cost.link
    return after, step_s / (step_s + exposed + cost.device + cost.host)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:5.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--rows", default="128,1024", help="rows per GPU, with measured steps")
    parser.add_argument(
        "--gpu", default="h100", choices=sorted(MEASURED_POSITIONS_PER_S), help="whose step times"
    )
    parser.add_argument(
        "--positions-per-s",
        default="",
        help="measured step rates, ROWS=RATE,... (e.g. 128=160000): they replace --gpu's",
    )
    args = parser.parse_args(argv)
    rates = dict(MEASURED_POSITIONS_PER_S[args.gpu])
    try:
        given = [part.split("=") for part in args.positions_per_s.split(",") if part]
        rates |= {int(rows): float(rate) for rows, rate in given}
        wanted = [int(value) for value in args.rows.split(",")]
    except ValueError:
        parser.error("--rows takes integers, --positions-per-s ROWS=RATE pairs")
    for rows in wanted:
        if rows not in rates or rows not in ROWS_TOUCHED:
            known = sorted(set(rates) & set(ROWS_TOUCHED))
            parser.error(
                f"--rows {rows}: the model has a measured step rate and rows touched for "
                f"{', '.join(map(str, known))} rows only (rates: --positions-per-s; rows touched: "
                "benchmarks/bench_softmax_rows.py)"
            )
    dense = dense_bytes(args.preset)
    clusters = {"8 GPUs, NVLink": Cluster(8, 1), "2 x 8 GPUs, 400 Gb/s": Cluster(8, 2)}
    print(f"PREDICTED data-parallel scaling of {args.preset} on {args.gpu} (a model; see --help)")
    print(f"dense gradients all-reduced per step: {dense / 2**20:.1f} MiB")
    summary: dict[str, object] = {"preset": args.preset, "gpu": args.gpu, "dense_bytes": dense}
    for rows in wanted:
        step_s = rows * WINDOW / rates[rows]
        padded = sparse_bytes(args.preset, rows)
        print(
            f"{rows} rows: step {step_s * 1e3:.1f} ms; {padded / 2**20:.1f} MiB of padded rows a "
            f"worker; rows touched, by workers: {ROWS_TOUCHED[rows]}"
        )
        summary[f"sparse_bytes@{rows}"] = padded
        for name, cluster in clusters.items():
            dense_s = all_reduce_seconds(dense, cluster)
            print(f"  {name}: dense all-reduce {ms(dense_s)} ms")
            for design, cost in designs(args.preset, rows, cluster).items():
                after, overlapped = efficiency(step_s, dense_s, cost)
                print(
                    f"    {design:36} link {ms(cost.link)}, device {ms(cost.device)}, host "
                    f"{ms(cost.host)} ms: {after:.0%} after the step, {overlapped:.0%} overlapped"
                )
                summary[f"{name}@{rows}/{design}"] = {
                    "link_ms": round(cost.link * 1e3, 2),
                    "device_ms": round(cost.device * 1e3, 2),
                    "host_ms": round(cost.host * 1e3, 2),
                    "efficiency": round(after, 3),
                    "efficiency_overlapped": round(overlapped, 3),
                }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
