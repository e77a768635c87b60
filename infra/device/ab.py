"""Each change timed against the tree before it, in one device call: ``gpu_bilm.py`` from each
tree in turn, alternated over rounds, so that the machine's drift falls on all alike.

    python -m infra.device.ab [BASELINE...] [--impls fused,graphed] [gpu_bilm.py's arguments]

Each ``BASELINE`` is a tree made by ``python -m infra.device.device_env baseline REF... DIR``
(``DIR/baseline-K``, its commit in ``COMMIT``), oldest first; this tree, the one the script sits
in, comes last. With ``--impls``, each tree runs each LSTM variant (or ``captured``, the whole
step replayed) in turn: one against another. Each run is its own process (its own CUDA context
and Inductor cache). Printed: each run's summary line, then one JSON object: per tree (and
variant) the runs' positions/s at each row count, and each one's median over the one before it's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RATE = "_positions_per_s"
# An ``--impls`` name that is not an LSTM variant: the whole step captured, the fused ops inside.
IMPL_ARGUMENTS = {"captured": ["--lstm-impl", "fused", "--capture-step"]}


def run(tree: Path, arguments: list[str]) -> dict[str, object]:
    """``gpu_bilm.py`` from ``tree``, importing ``tree``'s packages: its summary line. A tree from
    before ``infra`` was a package runs the same way, its folders namespace packages."""
    path = [str(tree), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    path = [p for p in path if Path(p).resolve() != REPO or tree.resolve() == REPO]
    environment = dict(os.environ) | {"PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(  # from the tree: its packages first on the path
        [sys.executable, "-m", "infra.device.gpu_bilm", *arguments],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        output = f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
        raise SystemExit(f"ab.py: infra.device.gpu_bilm in {tree} failed:\n{output}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(summary, dict)
    return summary


def rates(summary: dict[str, object]) -> dict[str, float]:
    """Positions/s by what was timed: ``ours``, ``ours@1024``, ``straightforward``."""
    return {
        key.removesuffix(RATE): float(str(value))
        for key, value in summary.items()
        if key.endswith(RATE)
    }


def compare(runs: dict[str, list[dict[str, float]]]) -> dict[str, object]:
    """Per tree (in the order timed) and rate, every round's figure; then, as ``"A -> B"``, each
    tree's median over the one before it's."""
    result: dict[str, object] = {
        tree: {name: [r[name] for r in rounds] for name in rounds[0]}
        for tree, rounds in runs.items()
    }
    trees = list(runs)
    result["ratio"] = {
        f"{before} -> {after}": {
            name: round(
                statistics.median(r[name] for r in runs[after])
                / statistics.median(r[name] for r in runs[before]),
                3,
            )
            for name in runs[after][0]
            if name in runs[before][0]
        }
        for before, after in zip(trees, trees[1:], strict=False)
    }
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the baselines lead; what follows is ab.py's options and gpu_bilm.py's, whose values
    # (``--only sweep``) argparse would take for more baselines
    baselines = [Path(a) for a in itertools.takewhile(lambda a: not a.startswith("-"), argv)]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--impls",
        default="",
        help="LSTM variants to time in turn on each tree (fused,graphed), or captured: the "
        "whole step as one CUDA graph",
    )
    args, arguments = parser.parse_known_args(argv[len(baselines) :])
    trees = {(tree / "COMMIT").read_text().strip()[:12]: tree for tree in baselines}
    trees["this"] = REPO
    impls = [impl for impl in args.impls.split(",") if impl]
    timed = {  # name -> (tree, gpu_bilm.py's arguments)
        f"{name} {impl}" if impl else name: (
            tree,
            [*arguments, *IMPL_ARGUMENTS.get(impl, ["--lstm-impl", impl])] if impl else arguments,
        )
        for name, tree in trees.items()
        for impl in impls or [""]
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in timed}
    for round_ in range(1, args.rounds + 1):
        for name, (tree, tree_arguments) in timed.items():
            summary = run(tree, tree_arguments)
            runs[name].append(rates(summary))
            print(f"round {round_}, {name}: {json.dumps(summary)}", flush=True)
    print(json.dumps(compare(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
