"""`make run` from nothing, as README tells a new user: a fresh clone, setup, run.

    python -m benchmarks.bench_make_run [--ref HEAD] [--keep DIR] [--results benchmarks/results]
        [--machine this|slow]

Clones ``--ref`` of this repository into a new directory, runs ``make setup`` (a new ``.venv``;
pip's download cache is the machine's) and ``make run`` with a new ``ELMO_HOME``, each timed as a
whole, then reads each stage's time from the MLflow runs the flow left (start to end of the
prepare, train, evaluate, register, adapt and analyze runs). Writes
``make_run-<date>.md`` into ``--results`` (README's times are copied from it) and, as its last
line, one JSON object. Nothing here is a baseline ratio: the figure is the wall time a user waits.
``--machine slow`` runs ``make run`` as on the slower machines users and CI get
(:mod:`benchmarks.machines`); ``make setup`` runs as it is (it waits on pip and the disk).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import print_summary
from benchmarks.machines import MACHINES, on_machine

REPO = Path(__file__).resolve().parents[1]
STAGES = ("prepare", "train", "evaluate", "register", "adapt", "analyze")
# Run in the clone's own environment: each stage run's seconds, by its stage tag.
STAGE_TIMES = """
import json, sys, mlflow
mlflow.set_tracking_uri(sys.argv[1])
runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
seconds = {}
for run in runs:
    stage = run.data.tags.get("elmo.stage")
    if stage and run.info.end_time:
        seconds[stage] = seconds.get(stage, 0) + (run.info.end_time - run.info.start_time) / 1000
print(json.dumps(seconds))
"""


def timed(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> float:
    """Seconds ``command`` took; its output goes to ``log`` (a failure prints the log's tail)."""
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if done.returncode:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="HEAD", help="the commit to clone")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--machine", choices=list(MACHINES), default="this")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-make-run-"))
    work.mkdir(parents=True, exist_ok=True)
    clone, home = work / "clone", work / "elmo-home"
    for path in (clone, home):
        shutil.rmtree(path, ignore_errors=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.ref], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELMO_", "MLFLOW_", "RAY_"))}
    env |= {"ELMO_HOME": str(home)}
    env = {k: v for k, v in env.items() if not k.startswith("PREFECT_")}
    setup = timed(["make", "setup"], env, clone, work / "setup.log")
    run = timed(*on_machine(args.machine, ["make", "run"], env), clone, work / "run.log")
    stages = json.loads(
        subprocess.run(
            [str(clone / ".venv" / "bin" / "python"), "-c", STAGE_TIMES,
             f"sqlite:///{home / 'mlflow.db'}"],
            capture_output=True, text=True, check=True, env=env,
        ).stdout.strip().splitlines()[-1]
    )  # fmt: skip
    today = datetime.date.today().isoformat()
    summary: dict[str, object] = {
        "benchmark": "make_run",
        "date": today,
        "commit": commit,
        "cores": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "emulated": args.machine,
        "setup_s": round(setup, 1),
        "run_s": round(run, 1),
        "total_s": round(setup + run, 1),
        "stages_s": {stage: round(stages[stage], 1) for stage in STAGES if stage in stages},
    }
    args.results.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.machine == "this" else f"-{args.machine}"
    results = args.results / f"make_run{suffix}-{today}.md"
    results.write_text(report(summary, work / "run.log"))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    print_summary(summary)
    return 0


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60):02d} s"


def report(summary: dict[str, object], run_log: Path) -> str:
    """The results file: the times, each stage's, and what ``make run`` printed at its end."""
    stages = summary["stages_s"]
    assert isinstance(stages, dict)
    lines = [
        f"# `make run` from nothing — {summary['date']} (commit {summary['commit']})",
        "",
        "A fresh clone, `make setup` (new `.venv`, pip's download cache warm), `make run` with a",
        f"new `ELMO_HOME`, alone on {summary['cores']} cores; `make run` on "
        f"{MACHINES[str(summary['emulated'])]}. Measured with",
        f"`python -m benchmarks.bench_make_run --machine {summary['emulated']}`.",
        "",
        "| part | time |",
        "|---|---|",
        f"| `make setup` | {minutes(float(summary['setup_s']))} |",  # type: ignore[arg-type]
        f"| `make run` | {minutes(float(summary['run_s']))} |",  # type: ignore[arg-type]
        f"| **both** | **{minutes(float(summary['total_s']))}** |",  # type: ignore[arg-type]
        "",
        "Each stage's MLflow run, start to end (the rest of `make run` is Python and Prefect",
        "starting, the flow's own steps and the final demo):",
        "",
        "| stage | time |",
        "|---|---|",
        *(f"| {stage} | {minutes(seconds)} |" for stage, seconds in stages.items()),
        "",
        "What `make run` printed after its progress lines:",
        "",
        "```",
        *_final_lines(run_log),
        "```",
        "",
    ]
    return "\n".join(lines)


def _final_lines(run_log: Path) -> list[str]:
    """The summary ``make run`` prints at its end (from the biLM line on)."""
    lines = run_log.read_text(errors="replace").splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("biLM models:/")), default=0)
    return lines[start:]


if __name__ == "__main__":
    sys.exit(main())
