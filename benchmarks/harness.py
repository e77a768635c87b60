"""What every ``bench_*.py`` shares: the timing protocol and the one machine-readable last line.

A benchmark builds its inputs once, checks that candidate and baseline agree
(:func:`check_agreement`), warms each up, times the median of several repeats
(:func:`time_in_turn`, :func:`seconds_per_call`) and prints a small table, then, as its last
line, one JSON object (:func:`print_summary`) that ``benchmarks/results/`` and the GPU suite read.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping


def time_in_turn(
    runs: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    synchronize: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median seconds of one call of each run, after ``warmup`` untimed calls of each.

    The runs take turns, one call each per round and the order rotated every round, so that a
    burst of load from other work on the machine falls on all of them alike. ``synchronize``
    (e.g. ``torch.cuda.synchronize``) is called before each timed call starts and before it
    ends, for devices that run asynchronously.
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            if synchronize is not None:
                synchronize()
            start = time.perf_counter()
            runs[name]()
            if synchronize is not None:
                synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def seconds_per_call(
    run: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    synchronize: Callable[[], None] | None = None,
) -> float:
    """Median seconds of one call of ``run`` alone (:func:`time_in_turn` with one run)."""
    return time_in_turn({"run": run}, repeats, warmup, synchronize)["run"]


def check_agreement(differences: Mapping[str, float], tolerance: float, what: str) -> None:
    """Stop the benchmark, naming ``what`` and every difference, when the largest is over
    ``tolerance``: a speed-up of a candidate that computes something else means nothing."""
    if differences and max(differences.values()) > tolerance:
        raise SystemExit(f"{what} disagree (tolerance {tolerance:g}): {dict(differences)}")


def print_summary(summary: Mapping[str, object]) -> None:
    """The benchmark's last line: its figures as one JSON object."""
    print(json.dumps(dict(summary)), flush=True)
