"""One analysis task-model run: this tree against another, and where its time goes.

    python -m benchmarks.bench_task_run --bilm MODEL_DIR --task TASK.yaml [--before TREE]
        [--fraction 0.1] [--repeats 2] [--profile] [--machine this|slow]

The run is the analysis's (``elmo analyze``): ``--fraction`` of the task's training split with
ELMo, seed 0, given the updates of the whole split. Each tree times it in a subprocess of its own,
the trees taking turns; ``--before`` is a checkout from before a change (``git worktree add
/tmp/before HEAD``), ``--profile`` prints each tree's top functions, ``--machine slow`` runs
them as on the slower machines users and CI get (:mod:`benchmarks.machines`). Last line: one JSON
object, each tree's seconds and test accuracy, ``speedup = before / this tree``; results in
benchmarks/results/analyze_twin-2026-11-28.md and task_lstm-2026-11-29.md.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import print_summary
from benchmarks.machines import MACHINES, on_machine

HERE = Path(__file__).resolve().parents[1]


def one_run(args: argparse.Namespace) -> dict[str, float]:
    """The worker: one run in whichever ``elmo_core`` this process imports."""
    import torch

    from elmo_core.analysis.sampling import subsample
    from elmo_core.analysis.task_runs import same_updates
    from elmo_core.tasks import load_task_config
    from elmo_core.tasks.readers import task_labels
    from elmo_core.tasks.trainer import train_task
    from pipelines.common.task_data import cache_splits, read_splits
    from pipelines.serving.bilm_loader import load_bilm, resolve_bilm

    torch.set_num_threads(args.threads)
    task = load_task_config(args.task)
    bilm = load_bilm(resolve_bilm(args.bilm)).bilm
    splits = cache_splits(bilm, read_splits(task), args.work / "activations")
    train = splits["train"]
    part = train
    if args.fraction < 1:
        part = train.subset(subsample(list(train.dataset.examples), args.fraction, 0))
    task = task.model_copy(update={"labels": task_labels(task, train.dataset)})  # as analyze does
    budget = same_updates(task, len(train.dataset.examples), len(part.dataset.examples))
    profiler = cProfile.Profile() if args.profile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = train_task(budget, part, splits["dev"], splits["test"], True, seed=0)
    seconds = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
    test = result.test_metrics["accuracy"]
    return {"seconds": seconds, "test": test, "epochs": result.best_epoch}


def in_tree(tree: Path, args: argparse.Namespace, profile: bool) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.bench_task_run", "--worker", "--bilm", args.bilm]
    command += ["--work", str(args.work), "--fraction", str(args.fraction)]
    command += ["--task", str(args.task.resolve()), "--threads", str(args.threads)]
    command += ["--profile"] if profile else []
    # the tree's own packages first; a tree from before benchmarks/ was a package (no
    # __init__.py) finds this one's worker after it, a regular package winning over a namespace
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    command, env = on_machine(args.machine, command, env)
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    if profile:
        print(f"--- profile, {tree} ---\n{done.stderr[-6000:]}", file=sys.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", required=True, help="a biLM model directory or URI")
    parser.add_argument("--before", type=Path, help="the tree before the change")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--task", type=Path, required=True, help="a task config (YAML)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--machine", choices=list(MACHINES), default="this")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(one_run(args)))
        return 0
    trees = {"this tree": HERE} | ({"before": args.before.resolve()} if args.before else {})
    with tempfile.TemporaryDirectory(prefix="bench-task-run-") as work:
        args.work = Path(work)
        times: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_ in range(args.repeats + args.profile):
            for name in list(trees)[round_ % len(trees) :] + list(trees)[: round_ % len(trees)]:
                profile = args.profile and round_ == args.repeats
                outcome = in_tree(trees[name], args, profile)
                print(f"round {round_}, {name}: {outcome}", file=sys.stderr, flush=True)
                if not profile:
                    times[name].append(outcome)
    summary: dict[str, object] = {"benchmark": "task_run", "fraction": args.fraction}
    summary |= {"machine": args.machine, "threads": args.threads}
    for name, outcomes in times.items():
        seconds = statistics.median(o["seconds"] for o in outcomes)
        summary[name] = {"seconds": round(seconds, 2), "test_accuracy": outcomes[0]["test"]}
        print(f"{name:>10}: {seconds:7.1f} s a run, test accuracy {outcomes[0]['test']:.4f}")
    if args.before:
        before = summary["before"]["seconds"]  # type: ignore[index]
        summary["speedup"] = round(before / summary["this tree"]["seconds"], 2)  # type: ignore[index]
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
