"""The paper's sample-efficiency claim (§5.4, Fig. 1) on real held-out tasks: is ELMo's gain at
10 % of the training data at least as large as at 100 %, beyond the gain's standard deviation?

Runs the real analyze stage (``pipelines.analyze.stage.analyze``) on UD English Web Treebank UPOS,
SUBJ and TREC coarse question types, read from ``../shared/data``, at ``--fractions`` of each
training set over ``--seeds``, one analyze run per task.

    python -m experiments.analysis_small_data --bilm RUN_DIR/best [--max-train 3000]

``--max-train`` caps each task's training set (its first sentences), for every task or per task
(``ud-ewt-upos=1000,subj=2000``). Last line: one JSON object, the gains per task and fraction and
the verdict; results in experiments/analysis_small_data-2026-11-27.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from elmo_core.analysis.sampling import smallest_fraction
from elmo_core.tasks.task_config import TaskConfig
from pipelines.analyze.stage import analyze
from pipelines.analyze.table import Row
from pipelines.common.task_data import read_splits

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
# --heads: this experiment's small heads; a task config's defaults, what `elmo analyze` runs
# (64-wide heads, the analysis's width where a config sets none); or those at the task width, 200
HEADS = {
    "small": (
        {"hidden_dim": 64, "dropout": 0.3},
        {"epochs": 10, "batch_size": 32, "lr": 0.003, "patience": 3, "min_updates": 100},
    ),
    "defaults": ({}, {}),
    "defaults-200": ({"hidden_dim": 200}, {}),
}
Heads = tuple[dict[str, object], dict[str, object]]


def ud_ewt(work: Path, max_train: int | None, heads: Heads) -> TaskConfig:
    """UPOS tags of the UD EWT treebank, its own splits (train capped to ``max_train``)."""
    source = SHARED / "ud_ewt"
    train = source / "en_ewt-ud-train.conllu"
    if max_train is not None:
        train = _first_sentences(train, work / "ud_ewt.train.conllu", max_train)
    return TaskConfig.model_validate(
        {
            "name": "ud-ewt-upos",
            "type": "tagging",
            "format": "conllu",
            "train": str(train),
            "dev": str(source / "en_ewt-ud-dev.conllu"),
            "test": str(source / "en_ewt-ud-test.conllu"),
            "reader": {"conllu_column": "upos"},
            "head": heads[0],
            "training": heads[1],
        }
    )


def subj(work: Path, max_train: int | None, heads: Heads) -> TaskConfig:
    """Subjective or objective sentences: a seeded 80/10/10 split of ``subj.all``."""
    lines = _lines(SHARED / "cls" / "subj.all")
    random.Random(0).shuffle(lines)
    tenth = len(lines) // 10
    splits = {"test": lines[:tenth], "dev": lines[tenth : 2 * tenth], "train": lines[2 * tenth :]}
    return _label_text("subj", work, splits, max_train, heads)


def trec(work: Path, max_train: int | None, heads: Heads) -> TaskConfig:
    """TREC's six coarse question types: its test set, a seeded tenth of train as dev."""
    train = _lines(SHARED / "cls" / "TREC.train.all")
    random.Random(0).shuffle(train)
    tenth = len(train) // 10
    splits = {
        "test": _lines(SHARED / "cls" / "TREC.test.all"),
        "dev": train[:tenth],
        "train": train[tenth:],
    }
    return _label_text("trec", work, splits, max_train, heads)


TASKS = {"ud-ewt-upos": ud_ewt, "subj": subj, "trec": trec}


def _label_text(
    name: str, work: Path, splits: dict[str, list[str]], max_train: int | None, heads: Heads
) -> TaskConfig:
    if max_train is not None:
        splits["train"] = splits["train"][:max_train]
    paths = {}
    for split, lines in splits.items():
        paths[split] = work / f"{name}.{split}.txt"
        paths[split].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return TaskConfig.model_validate(
        {
            "name": name,
            "type": "classification",
            "format": "label_text",
            **{split: str(path) for split, path in paths.items()},
            "head": heads[0] | {"pooling": "max"},
            "training": heads[1],
        }
    )


def _lines(path: Path) -> list[str]:
    """``label sentence`` lines; one with a label and no sentence (``subj.all`` has one) is
    left out."""
    text = path.read_text(encoding="latin-1")  # split at "\n" only: latin-1 has line breaks
    lines = (line.rstrip() for line in text.split("\n"))  # of its own (\x85) inside sentences
    return [line for line in lines if len(line.split(maxsplit=1)) == 2]


def _first_sentences(source: Path, target: Path, count: int) -> Path:
    """The first ``count`` sentences of a CoNLL-U file (blocks ending in a blank line)."""
    blocks = source.read_text(encoding="utf-8").split("\n\n")
    target.write_text("\n\n".join(blocks[:count]) + "\n\n", encoding="utf-8")
    return target


def verdict(rows: list[Row], name: str) -> dict[str, object]:
    """Each fraction's gain and its standard deviation (√(s²_ELMo + s²_baseline)), from the
    task's two sample-efficiency rows; whether 10 % gains at least as much as 100 %, beyond its
    standard deviation."""
    curves = {
        model: next(
            row.cells
            for row in rows
            if row.analysis.startswith(f"{name} ")
            and row.analysis.endswith(f", {model} by train fraction")
        )
        for model in ("elmo", "baseline")
    }
    gains = {
        column: (
            cell.mean - curves["baseline"][column].mean,
            math.hypot(cell.sd, curves["baseline"][column].sd),
        )
        for column, cell in curves["elmo"].items()
    }
    small, full = gains.get("10%"), gains.get("100%")
    holds = small is not None and full is not None and small[0] >= full[0] and small[0] > small[1]
    scores = {
        model: {column: [round(c.mean, 4), round(c.sd, 4)] for column, c in cells.items()}
        for model, cells in curves.items()
    }
    gains_out = {column: [round(g, 4), round(sd, 4)] for column, (g, sd) in gains.items()}
    return {"gains": gains_out, "holds": holds, "scores": scores}


def caps(text: str | None, names: list[str]) -> dict[str, int | None]:
    """``--max-train``: one cap for every task (``1000``) or one per task (``subj=2000,...``)."""
    if text is None:
        return dict.fromkeys(names)
    if "=" not in text:
        return dict.fromkeys(names, int(text))
    given = dict(part.split("=", 1) for part in text.split(","))
    return {name: int(given[name]) if name in given else None for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bilm", required=True, help="the biLM: a model directory or URI")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--fractions", default="0.01,0.05,0.1,1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--max-train", help="cap the training sentences: N for every task, or task=N,..."
    )
    parser.add_argument("--work", type=Path, default=Path("analysis-small-data"))
    parser.add_argument("--heads", choices=list(HEADS), default="small")
    args = parser.parse_args(argv)
    if not SHARED.is_dir():
        print(f"no {SHARED}: the real task sets are not on this machine", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.tasks.split(",")
    max_train = caps(args.max_train, names)
    summary: dict[str, object] = {
        "benchmark": "analysis_small_data",
        "bilm": args.bilm,
        "seeds": seeds,
        "max_train": max_train,
        "heads": args.heads,
    }
    started_all = time.perf_counter()
    for name in names:  # one analyze run each: a finished task is kept
        task = TASKS[name](args.work, max_train[name], HEADS[args.heads])
        config = yaml.safe_dump(task.model_dump(mode="json", exclude_defaults=True))
        (args.work / f"{name}.yaml").write_text(config)  # for benchmarks/bench_task_run.py
        kept = feasible(task, fractions)
        started = time.perf_counter()
        result = analyze([task], args.bilm, fractions=kept, seeds=seeds)
        print("\n".join(result.headline), flush=True)
        summary[name] = {
            "fractions": kept,
            "run_id": result.run_id,
            "seconds": round(time.perf_counter() - started, 1),
            **verdict(result.rows, name),
        }
        print(json.dumps({name: summary[name]}), flush=True)  # kept should a later task fail
    summary["seconds"] = round(time.perf_counter() - started_all, 1)
    print(json.dumps(summary))
    return 0


def feasible(task: TaskConfig, fractions: list[float]) -> list[float]:
    """``fractions``, each below the smallest that keeps one example of every label raised to
    it (a 1 % draw of TREC would leave its rarest type, 86 of 4,907, with none)."""
    examples = read_splits(task)["train"].examples
    counts = Counter(getattr(example, "label", None) for example in examples)
    least = smallest_fraction(min(counts.values()))
    return sorted({max(fraction, least) for fraction in fractions})


if __name__ == "__main__":
    sys.exit(main())
