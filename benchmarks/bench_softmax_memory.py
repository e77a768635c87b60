"""Peak memory of the sampled-softmax loss, forward + backward: whole logits against chunks.

    python -m benchmarks.bench_softmax_memory [--positions 20480] [--chunk-sizes 512,2048]

At ``original``'s shape on the CPU, each computation in a fresh process: the baseline
(``whole``, the sampled loss as computed before it was chunked, written out below) builds the whole
``(N, 1+K)`` logits; :meth:`elmo_core.model.softmax.SampledSoftmax.sampled_loss` takes ``C``
positions at a time. Last line: one JSON object; ``ratio`` = the baseline's peak over the chunked
one's at the default chunk size. Method and results: benchmarks/results/bench_softmax_memory-*.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness import print_summary
from elmo_core.model.sampler import LogUniformSampler, touched_rows
from elmo_core.model.softmax import SampledSoftmax, SoftmaxRows, sampled_chunk_size
from elmo_core.presets import model_preset

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 793_471  # original's vocabulary (1B Word Benchmark)
ORIGINAL = model_preset("original")
MB = 1e6


def whole_logits_loss(
    softmax: SampledSoftmax,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    candidates: torch.Tensor,
    target_counts: torch.Tensor,
    candidate_counts: torch.Tensor,
    rows: SoftmaxRows,
) -> torch.Tensor:
    """The baseline: ``sampled_loss`` before it was chunked, the ``(N, 1+K)`` logits at once."""
    hidden = hidden.to(softmax.weight.dtype)
    ids = torch.cat([targets, candidates])  # (N+K,)
    weights, biases = rows.select(ids)  # (N+K, P), (N+K,)
    num_positions = targets.numel()
    target_rows, candidate_rows = weights[:num_positions], weights[num_positions:]
    target_logits = (hidden * target_rows).sum(-1).float()  # (N,)
    candidate_logits = (hidden @ candidate_rows.t()).float()  # (N, K)
    target_log_q = target_counts.log().float()  # (N,)
    candidate_log_q = candidate_counts.log().float()  # (K,)
    target_logits = target_logits + biases[:num_positions].float() - target_log_q
    candidate_logits = candidate_logits + biases[num_positions:].float() - candidate_log_q
    hits = targets.unsqueeze(1) == candidates.unsqueeze(0)  # (N, K)
    candidate_logits = candidate_logits.masked_fill(hits, torch.finfo(torch.float32).min)
    logits = torch.cat([target_logits.unsqueeze(1), candidate_logits], dim=1)  # (N, 1+K)
    return torch.logsumexp(logits, dim=1) - target_logits


def measure(method: str, positions: int, samples: int, dim: int) -> dict[str, float]:
    """One forward + backward of ``method`` ('whole' or a chunk size) in this process: the peak
    resident set it adds (MB), the process's peak, and its seconds."""
    generator = torch.Generator().manual_seed(0)
    sampler = LogUniformSampler(VOCAB_SIZE)
    drawn = sampler.sample_unique(samples, generator)
    words = sampler.draw(positions, generator)  # (N,): targets as frequent as real words
    ids = torch.from_numpy(touched_rows(words.numpy(), drawn.ids.numpy()))  # (U,)
    # The softmax over the touched rows only: the vocabulary ids become their places among them.
    torch.manual_seed(0)
    softmax = SampledSoftmax(ids.numel(), dim, samples, sparse=True).train()
    targets, candidates = torch.searchsorted(ids, words), torch.searchsorted(ids, drawn.ids)
    target_counts = sampler.expected_count(words, drawn.num_tries)  # (N,)
    candidate_counts = sampler.expected_count(drawn.ids, drawn.num_tries)  # (K,)
    hidden = torch.randn(positions, dim, requires_grad=True)

    def forward_backward(positions: slice) -> float:
        """One pass over ``positions``, every candidate; its seconds."""
        started = time.perf_counter()
        rows = softmax.gather_rows(torch.arange(ids.numel()))  # each step gathers its own
        inputs = (hidden[positions], targets[positions], candidates)
        counts = (target_counts[positions], candidate_counts)
        if method == "whole":
            loss = whole_logits_loss(softmax, *inputs, *counts, rows)
        else:
            loss = softmax.sampled_loss(*inputs, *counts, rows, chunk_size=int(method))
        loss.mean().backward()
        return time.perf_counter() - started

    forward_backward(slice(0, 64))  # libraries' code and thread pools in: not the pass's memory
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    seconds = forward_backward(slice(None))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_added_mb": (after - before) * 1024 / MB,
        "peak_mb": after * 1024 / MB,
        "seconds": seconds,
        "touched_rows": ids.numel(),
    }


def run_child(method: str, args: argparse.Namespace) -> dict[str, float]:
    """``measure`` in a fresh process, so no earlier run's high-water mark hides this one."""
    command = [sys.executable, "-m", "benchmarks.bench_softmax_memory", "--child", method]
    command += ["--positions", str(args.positions), "--samples", str(args.samples)]
    command += ["--dim", str(args.dim)]
    done = subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.PIPE, text=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=1024 * 20)  # N: rows × unroll steps
    parser.add_argument("--samples", type=int, default=ORIGINAL.num_samples)  # K
    parser.add_argument("--dim", type=int, default=ORIGINAL.lstm.projection_dim)  # P
    parser.add_argument("--chunk-sizes", default="512,2048")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.positions, args.samples, args.dim)))
        return 0
    default_chunk = sampled_chunk_size(args.samples)
    chunks = sorted({int(c) for c in args.chunk_sizes.split(",")} | {default_chunk})
    results = {"whole": run_child("whole", args)}
    results.update({str(chunk): run_child(str(chunk), args) for chunk in chunks})
    baseline = results["whole"]["peak_added_mb"]
    logits_mb = args.positions * (args.samples + 1) * 4 / MB
    print(
        f"sampled softmax forward + backward, N = {args.positions:,}, K = {args.samples:,}, "
        f"P = {args.dim}, {int(results['whole']['touched_rows']):,} touched rows, "
        f"{os.cpu_count()} CPUs; whole (N, 1+K) float32 logits = {logits_mb:,.0f} MB"
    )
    print(
        f"{'computation':22} {'peak added MB':>14} {'vs whole':>9} {'process peak MB':>16} {'s':>7}"
    )
    for method, result in results.items():
        name = "whole logits" if method == "whole" else f"chunked, C = {int(method):,}"
        print(
            f"{name:22} {result['peak_added_mb']:14,.0f} "
            f"{baseline / result['peak_added_mb']:8.1f}x {result['peak_mb']:16,.0f} "
            f"{result['seconds']:7.2f}"
        )
    chunked = results[str(default_chunk)]["peak_added_mb"]
    summary = {
        "benchmark": "softmax_memory",
        "positions": args.positions,
        "samples": args.samples,
        "dim": args.dim,
        "logits_mb": round(logits_mb, 1),
        **{f"peak_added_mb_{m}": round(r["peak_added_mb"], 1) for m, r in results.items()},
        **{f"seconds_{m}": round(r["seconds"], 2) for m, r in results.items()},
        "chunk_size": default_chunk,
        "ratio": round(baseline / chunked, 2),
    }
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
