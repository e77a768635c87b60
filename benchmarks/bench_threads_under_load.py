"""Torch threads under load: the training step with 1 and 2 threads beside competing CPU work.

    python -m benchmarks.bench_threads_under_load              # ptb-small, 32 rows × 20, 4 spinners
    python -m benchmarks.bench_threads_under_load --load torch --hogs 2  # beside torch jobs
    python -m benchmarks.bench_threads_under_load --smoke      # tiny sizes, loaded rounds only (CI)

Threads under load: on a loaded 2-core machine two torch threads ran the step far
slower than one. Times 1 thread, 2, 2 with ``OMP_WAIT_POLICY=PASSIVE`` and 2 cut by
:func:`elmo_core.threads.threads_under_load` (the fix), beside ``--hogs`` competing processes and
without them. Last line: one JSON object (``ratio_2threads_vs_1thread`` < 1: two threads slower).
Method and results: benchmarks/results/bench_threads_under_load-2026-11-25.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from benchmarks.harness import print_summary
from elmo_core.threads import threads_under_load

REPO = Path(__file__).resolve().parents[1]
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SETTINGS = {  # name: (torch threads, OMP_WAIT_POLICY or None for OpenMP's default)
    "1-thread": (1, None),
    "2-threads": (2, None),
    "2-threads-passive": (2, "PASSIVE"),
    "2-under-load": (2, None),  # elmo_core.threads.threads_under_load(2), as the workers take
}
HOGS = {  # --load: a competing process; it runs until stopped or the benchmark is gone
    "spin": (
        "import os, sys\n"
        "parent = int(sys.argv[1])\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(1_000_000):\n"
        "        pass\n"
    ),
    "torch": (  # another user's torch job: 2 threads, OpenMP's default policy, a barrier per op
        "import os, sys, torch\n"
        "parent = int(sys.argv[1])\n"
        "torch.set_num_threads(2)\n"
        "x = torch.randn(64, 4096)\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(100):\n"
        "        x = torch.tanh(x) * 2\n"
    ),
}


@contextmanager
def competing_load(
    hogs: int, load: str, niceness: int = 0
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``hogs`` processes of :data:`HOGS` ``load`` at ``niceness`` for the duration; SIGTERM ends
    this script through here too."""
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    command = [sys.executable, "-c", HOGS[load], str(os.getpid())]
    processes = [
        subprocess.Popen(command, env=child_env(None), preexec_fn=lambda: os.nice(niceness))
        for _ in range(hogs)
    ]
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def wait_for_load(level: float, seconds: float) -> tuple[float, float, float]:
    """The load average once its last minute reaches ``level`` (the fix cuts threads from there)
    or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] < level and time.monotonic() < deadline:
        time.sleep(1)
    return os.getloadavg()


def child_env(policy: str | None) -> dict[str, str]:
    """This environment with the OpenMP wait policy ``policy`` (None: unset, OpenMP's default)."""
    env = {key: value for key, value in os.environ.items() if key != WAIT_POLICY_ENV}
    env.pop("OMP_NUM_THREADS", None)
    if policy is not None:
        env[WAIT_POLICY_ENV] = policy
    return env


def time_setting(args: argparse.Namespace, name: str) -> tuple[list[float], int]:
    """Seconds per timed step of ``name`` in a fresh process, and the threads it ran."""
    threads, policy = SETTINGS[name]
    command = [sys.executable, "-m", "benchmarks.bench_threads_under_load", "--child"]
    command += ["--threads", str(threads)]
    if name == "2-under-load":
        command.append("--under-load")
    for flag in ("preset", "variant", "rows", "window", "vocab", "types", "seconds", "min_steps"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    # a fresh process, its environment set before it imports torch: libgomp reads
    # OMP_WAIT_POLICY once, as it loads with torch
    result = subprocess.run(
        command, cwd=REPO, env=child_env(policy), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report["seconds"], report["threads"]


def run_child(args: argparse.Namespace) -> int:
    """One setting's timed steps, as JSON; this process's environment is the setting's."""
    import torch  # here: the parent never loads torch, nor its OpenMP runtime

    from benchmarks.bench_cpu_step import build_step, model_config

    torch.set_num_threads(threads_under_load(args.threads) if args.under_load else args.threads)
    config = model_config(args.preset)
    run = build_step(config, args.variant, args.rows, args.window, args.vocab, args.types)
    run()
    seconds: list[float] = []
    started = time.perf_counter()
    while len(seconds) < args.min_steps or time.perf_counter() - started < args.seconds:
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"threads": torch.get_num_threads(), "seconds": seconds}))
    return 0


def time_rounds(args: argparse.Namespace, rounds: int) -> dict[str, tuple[float, list[int]]]:
    """Positions/s of each setting (the median step over ``rounds`` rounds, the order rotated)
    and the threads each of its processes ran."""
    names = list(SETTINGS)
    times: dict[str, list[float]] = {name: [] for name in names}
    threads: dict[str, list[int]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            seconds, ran = time_setting(args, name)
            times[name] += seconds
            threads[name].append(ran)
    return {
        name: (args.rows * args.window / statistics.median(times[name]), threads[name])
        for name in names
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ptb-small", help="a preset or a configs/ name")
    parser.add_argument("--variant", default="fused", help="bench_cpu_step's variant")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=10_003, help="softmax words (PTB's)")
    parser.add_argument("--types", type=int, default=10_003, help="distinct synthetic words")
    parser.add_argument("--hogs", type=int, default=4, help="competing processes")
    parser.add_argument("--load", choices=list(HOGS), default="spin", help="what each one runs")
    parser.add_argument(
        "--hog-nice", type=int, default=0, help="their niceness (19: a batch job set aside)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds under load")
    parser.add_argument(
        "--settle", type=float, default=45.0, help="most seconds to wait for the load to build"
    )
    parser.add_argument(
        "--idle-rounds", type=int, default=1, help="rounds without the load (0: none)"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per process")
    parser.add_argument("--min-steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--under-load", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.smoke:  # four processes, one niced hog: the suite's other tests run beside it
        args.preset, args.rows, args.window, args.vocab, args.types = "tiny", 4, 5, 200, 50
        args.hogs, args.rounds, args.idle_rounds, args.seconds, args.min_steps = 1, 1, 0, 0, 1
        args.settle, args.hog_nice = 0, 19
    started = time.perf_counter()
    with competing_load(args.hogs, args.load, args.hog_nice):
        # the fix reads the 1-minute load average, which lags: time once it reaches the core
        # count; right after the load it still cuts (the rounds without it show that)
        load_before = wait_for_load(float(os.cpu_count() or 1), args.settle)
        loaded = time_rounds(args, args.rounds)
        load_after = os.getloadavg()
    idle = time_rounds(args, args.idle_rounds) if args.idle_rounds else {}
    load_idle = os.getloadavg()
    print(
        f"Training step ({args.preset}, {args.variant}, {args.rows} rows × {args.window}, "
        f"vocab {args.vocab:,}), fresh process per setting and round, median step; "
        f"{os.cpu_count()} CPUs; {args.hogs} competing processes ({args.load}, nice "
        f"{args.hog_nice}): load average (1 min) {load_before[0]:.2f} at the first step, "
        f"{load_after[0]:.2f} at the end, {load_idle[0]:.2f} after the runs without them; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(
        f"{'setting':20} {'under load pos/s':>17} {'threads':>8} "
        f"{'no load pos/s':>14} {'threads':>8}"
    )
    for name in SETTINGS:
        (rate, ran), (idle_rate, idle_ran) = loaded[name], idle.get(name, (math.nan, []))
        print(f"{name:20} {rate:17,.0f} {_ran(ran):>8} {idle_rate:14,.0f} {_ran(idle_ran):>8}")
    summary: dict[str, object] = {
        "benchmark": "threads_under_load",
        "preset": args.preset,
        "rows": args.rows,
        "window": args.window,
        "hogs": args.hogs,
        "load": args.load,
        "hog_nice": args.hog_nice,
        "loadavg_1min_under_load": round(load_after[0], 2),
    }
    for name in SETTINGS:
        summary[f"{_key(name)}_loaded_positions_per_s"] = round(loaded[name][0], 1)
        summary[f"{_key(name)}_threads_loaded"] = loaded[name][1]
        if idle:
            summary[f"{_key(name)}_idle_positions_per_s"] = round(idle[name][0], 1)
    for name in ("2-threads", "2-threads-passive", "2-under-load"):
        summary[f"ratio_{_key(name)}_vs_1thread"] = round(
            loaded[name][0] / loaded["1-thread"][0], 3
        )
    for name, rates in (("loaded", loaded), ("idle", idle)):
        if not rates:
            continue
        summary[f"ratio_{name}_2threads_passive_vs_2threads"] = round(
            rates["2-threads-passive"][0] / rates["2-threads"][0], 3
        )
    print_summary(summary)
    return 0


def _key(name: str) -> str:
    return name.replace("-threads", "threads").replace("-thread", "thread").replace("-", "_")


def _ran(threads: list[int]) -> str:
    return ",".join(str(value) for value in sorted(set(threads)))


if __name__ == "__main__":
    sys.exit(main())
