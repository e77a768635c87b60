"""A measurement run on several gloo ranks of this machine, each a spawned process (a fresh
interpreter: CUDA does not survive a fork): what the exchange benchmark and the device's two-rank
measurement share."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

Measure = Callable[[int, Any], dict[str, Any]]  # (rank, arguments) -> that rank's figures


def on_gloo_ranks(measure: Measure, world_size: int, arguments: Any) -> list[dict[str, Any]]:
    """Each rank's ``measure(rank, arguments)`` in a process group of ``world_size`` gloo ranks
    on 127.0.0.1, in rank order. ``measure`` must be importable (spawn pickles it by name)."""
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _rank,
        args=(measure, world_size, _free_port(), arguments, results),
        nprocs=world_size,
        start_method="spawn",
        join=True,
    )
    figures = [results.get() for _ in range(world_size)]
    return [rank_figures for _, rank_figures in sorted(figures, key=lambda pair: pair[0])]


def _rank(
    rank: int, measure: Measure, world_size: int, port: int, arguments: Any, results: Any
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        results.put((rank, measure(rank, arguments)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
