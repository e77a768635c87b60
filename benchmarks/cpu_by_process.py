"""Where a command's CPU goes, by kind of process: the suite's own, Ray's workers and daemons,
Prefect, MLflow, the commands the tests start.

    python -m benchmarks.cpu_by_process [--machine this|slow] [--interval 1] -- COMMAND ...

Runs COMMAND (as on ``--machine``, :mod:`benchmarks.machines`) and, every ``--interval`` seconds,
reads the CPU time of every process on the machine that started after it began; this sampler
runs at nice 19 beside it. Prints CPU seconds and process counts by kind, the machine's busy CPU
seconds and the wall time, and, as its last line, one JSON object. A process that starts and ends
between two samples is missed: the gap between the busy seconds and the sum says how much. On a
test suite the figures are CPU work, which is what a one-core machine waits for.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence

import psutil

from benchmarks.harness import print_summary
from benchmarks.machines import MACHINES, on_machine

# (kind, pattern in the command line), the first that matches; a Ray worker's line is read as
# it starts, before Ray renames it after its actor.
KINDS = (
    ("Ray worker (a job's runtime env)", r"ray/_private/workers/setup_worker\.py"),
    ("Ray worker", r"ray/_private/workers/default_worker\.py|^ray::"),
    ("Ray daemons", r"/raylet |gcs_server|dashboard|log_monitor|autoscaler|runtime_env/agent"),
    ("Prefect", r"prefect|uvicorn"),
    ("MLflow", r"mlflow|huey"),
    ("pytest", r"pytest|exec\(eval\(sys\.stdin"),  # pytest-xdist's workers start so
)


def kind(cmdline: str, name: str) -> str:
    """The kind of a process: one of :data:`KINDS`, else ``python -m MODULE``, else its name."""
    for label, pattern in KINDS:
        if re.search(pattern, cmdline):
            return label
    module = re.search(r"python\S* .*?-m (\S+)", cmdline)
    return f"python -m {module.group(1)}" if module else name


def busy_seconds() -> float:
    """CPU seconds the machine has spent on anything but idling, since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class Samples:
    """The newest CPU time of each process seen, keyed by pid and start time (pids are reused)."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}

    def take(self) -> None:
        for process in psutil.process_iter(["pid", "create_time", "name", "cmdline", "cpu_times"]):
            info = process.info
            if info["cpu_times"] is None or (info["create_time"] or 0) < self.since:
                continue  # gone, not ours to read, or older than the command
            key = (info["pid"], info["create_time"])
            previous = self.seen.get(key)
            cmdline, name = " ".join(info["cmdline"] or []), info["name"] or "?"
            label = previous[0] if previous else kind(cmdline, name)
            self.seen[key] = (label, info["cpu_times"].user + info["cpu_times"].system)

    def by_kind(self) -> tuple[Counter[str], Counter[str]]:
        seconds: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for label, cpu in self.seen.values():
            seconds[label] += cpu
            counts[label] += 1
        return seconds, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", choices=MACHINES, default="this")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--top", type=int, default=25, help="kinds in the table")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command: Sequence[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give it after --")
    command, env = on_machine(args.machine, command, os.environ)
    samples = Samples(since=time.time() - 1)  # create_time is rounded
    busy, started = busy_seconds(), time.monotonic()
    running = subprocess.Popen(command, env=env)
    os.nice(19)  # after the start: the command keeps this process's priority
    while running.poll() is None:
        samples.take()
        time.sleep(args.interval)
    samples.take()
    wall, busy = time.monotonic() - started, busy_seconds() - busy
    seconds, counts = samples.by_kind()
    seen, processes = sum(seconds.values()), sum(counts.values())
    print(
        f"{' '.join(command)}: exit {running.returncode}, {wall:.0f} s, machine busy {busy:.0f} "
        f"CPU s, {seen:.0f} of them seen in {processes} processes"
    )
    print(f"{'CPU s':>8} {'processes':>10}  kind")
    for label, cpu in seconds.most_common(args.top):
        print(f"{cpu:8.1f} {counts[label]:10d}  {label}")
    print_summary(
        {
            "benchmark": "cpu_by_process",
            "machine": args.machine,
            "returncode": running.returncode,
            "wall_s": round(wall, 1),
            "busy_cpu_s": round(busy, 1),
            "cpu_s": {label: round(cpu, 1) for label, cpu in seconds.most_common()},
            "processes": dict(counts.most_common()),
        }
    )
    return running.returncode


if __name__ == "__main__":
    sys.exit(main())
