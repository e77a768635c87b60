"""Throughput and peak memory of ``elmo prepare`` against a naive pure-Python preparer.

    python -m benchmarks.bench_prepare [--data-root ../shared/data] [--size-mb 200] [--quick]
        [--repeats 3] [--workers-list 1,2] [--max-vocab 100000] [--keep-corpus] [--cache-dir DIR]

On a corpus of PTB and the books in the 1B Word Benchmark layout (:mod:`prepare_corpus`),
:func:`naive_prepare` (the baseline) against ``elmo prepare --workers N``, both as subprocesses,
their results checked to agree first: wall time, peak memory at the corpus's size and twice it, and
the scaling from 1 to 2 workers beside a CPU-only reference job. Skips (exit 0) without the data
root. Last line: one JSON object with ``ratio = baseline_seconds / candidate_seconds`` (one
worker). Method: benchmarks/results/bench_prepare_library_kernels-2026-11-23.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.harness import print_summary
from benchmarks.prepare_corpus import build_corpus, corpus_files, doubled_corpus, source_files
from elmo_core.data.shards import target_ids

REPO = Path(__file__).resolve().parents[1]
MODULE = [sys.executable, "-m", "benchmarks.bench_prepare"]  # this script, run from REPO
SPECIALS = ("<S>", "</S>", "<UNK>")  # bilm-tf's vocabulary head, as elmo_core.text.vocab


# --- the two implementations and what they produce -----------------------------------------------


@dataclass
class Summary:
    """What both implementations must agree on."""

    vocab: list[str]  # id order, specials first
    counts: list[int]  # training count of vocab[3:]
    num_tokens: dict[str, int]
    num_sentences: dict[str, int]
    num_oov: dict[str, int]
    target_sum: dict[str, int]  # sum of every target id per split: the ids themselves agree


def naive_prepare(corpus: Path, out: Path, max_vocab: int | None) -> Summary:
    """The baseline: split() per line, a Counter, Python lists of ids written by pyarrow."""
    train, heldout = corpus_files(corpus)
    counter: Counter[str] = Counter()
    for path in train:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                counter.update(line.split())
    for special in SPECIALS:
        counter.pop(special, None)
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))  # code point = UTF-8
    ranked = ranked[: max_vocab - len(SPECIALS)] if max_vocab else ranked
    vocab = [*SPECIALS, *(token for token, _ in ranked)]
    ids = {token: i for i, token in enumerate(vocab)}
    summary = Summary(vocab, [c for _, c in ranked], {}, {}, {}, {})
    for split, paths in (("train", train), ("heldout", heldout)):
        sentences = tokens = oov = total = 0
        for path in paths:
            rows = []
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    if words := line.split():
                        rows.append([ids.get(word, 2) for word in words])
            targets = pa.array(rows, pa.list_(pa.int32()))
            pq.write_table(pa.table({"targets": targets}), out / f"{split}-{path.name}.parquet")
            flat = pc.list_flatten(targets)  # the check's figures, not part of the naive work
            sentences, tokens = sentences + len(rows), tokens + len(flat)
            oov += int(pc.sum(pc.equal(flat, 2).cast(pa.int64())).as_py() or 0)
            total += int(pc.sum(flat.cast(pa.int64())).as_py() or 0)
        summary.num_sentences[split], summary.num_tokens[split] = sentences, tokens
        summary.num_oov[split], summary.target_sum[split] = oov, total
    (out / "summary.json").write_text(json.dumps(asdict(summary)), encoding="utf-8")
    return summary


def read_naive(out: Path) -> Summary:
    return Summary(**json.loads((out / "summary.json").read_text(encoding="utf-8")))


def read_prepared(out: Path) -> Summary:
    """The same figures from a prepared dataset (vocab files, manifest, shards)."""
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    rows = (out / "vocab_counts.tsv").read_text(encoding="utf-8").splitlines()
    splits = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["splits"]
    target_sum = {}
    for split in splits:
        types = pq.read_table(out / split, columns=["types"])["types"]
        targets = target_ids(pc.list_flatten(types).to_numpy(), len(vocab))
        target_sum[split] = int(targets.sum(dtype=np.int64))
    return Summary(
        vocab=vocab,
        counts=[int(row.rsplit("\t", 1)[1]) for row in rows[len(SPECIALS) :]],
        num_tokens={s: info["num_tokens"] for s, info in splits.items()},
        num_sentences={s: info["num_sentences"] for s, info in splits.items()},
        num_oov={s: info["num_oov_tokens"] for s, info in splits.items()},
        target_sum=target_sum,
    )


def check_agree(baseline: Summary, candidate: Summary) -> None:
    """Raise naming the first field on which the two implementations differ."""
    for name, expected in asdict(baseline).items():
        got = getattr(candidate, name)
        if got != expected:
            if isinstance(expected, list):
                first = next(
                    (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), None
                )
                detail = f"lengths {len(expected)} / {len(got)}, first difference at {first}"
            else:
                detail = f"{expected} / {got}"
            raise AssertionError(f"baseline and candidate disagree on {name}: {detail}")


# --- running and measuring -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu_seconds: float  # user + system of the whole tree (children by their last sample)
    main_peak_mb: float | None  # the command's own process: its RSS high-water mark
    child_peak_mb: float | None  # the largest high-water mark among its descendants
    tree_peak_mb: float | None  # the peak of the whole tree's summed PSS
    phases: dict[str, float] | None = None  # prepare's own "phases:" line


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            stack.extend(children)
    return found


def _memory_kb(pid: int, field: str, name: str) -> int | None:
    """A ``kB`` field of ``/proc/PID/{name}`` (None once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def measure(command: list[str], env: dict[str, str], interval: float = 0.1) -> Run:
    """Run ``command``; its wall and CPU time and peak memory (see the module doc), sampled."""
    main = child = tree = 0
    cpu_seen: dict[int, float] = {}
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        while not (done := os.wait4(process.pid, os.WNOHANG))[0]:
            main = max(main, _memory_kb(process.pid, "VmHWM", "status") or 0)
            pss = 0
            for pid in [process.pid, *_descendants(process.pid)]:
                if pid != process.pid:
                    child = max(child, _memory_kb(pid, "VmHWM", "status") or 0)
                pss += _memory_kb(pid, "Pss:", "smaps_rollup") or 0
                cpu_seen[pid] = max(cpu_seen.get(pid, 0.0), _cpu_seconds(pid))
            tree = max(tree, pss)
            time.sleep(interval)
        seconds = time.perf_counter() - started
        _, status, usage = done
        process.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        printed = log.read().decode(errors="replace")
        if process.returncode:
            tail = printed[-3000:]
            raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{tail}")
    # wait4 counts the command and the children it reaped (all of them, or only some: the
    # forkserver's workers may be left to it); the samples count everyone up to the last poll
    cpu = max(usage.ru_utime + usage.ru_stime, sum(cpu_seen.values()))
    memory = (kb / 1024 if kb else None for kb in (main, child, tree))
    return Run(seconds, cpu, *memory, phases=parse_phases(printed))


def parse_phases(printed: str) -> dict[str, float] | None:
    """``{"count": 1.07, ...}`` from prepare's ``phases: count 1.07s, ...`` line, if printed."""
    for line in printed.splitlines():
        if line.startswith("phases: "):
            pairs = (item.rsplit(" ", 1) for item in line[len("phases: ") :].split(", "))
            return {name: float(value.rstrip("s")) for name, value in pairs}
    return None


def naive_command(corpus: Path, out: Path, max_vocab: int | None) -> list[str]:
    vocab = ["--max-vocab", str(max_vocab)] if max_vocab else []
    return [*MODULE, "--run-naive", str(corpus), str(out), *vocab]


def prepare_command(corpus: Path, out: Path, max_vocab: int | None, workers: int) -> list[str]:
    vocab = ["--max-vocab", str(max_vocab)] if max_vocab else []
    return [
        *(sys.executable, "-m", "pipelines.cli", "prepare"),
        *("--corpus", str(corpus), "--out", str(out)),
        *("--format", "1b-benchmark", "--workers", str(workers), *vocab),
    ]


def fresh(out: Path) -> Path:
    """An empty output directory (prepare would otherwise resume the previous run)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


# --- the benchmark -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--size-mb", type=int, default=200, help="training text of the corpus")
    parser.add_argument("--quick", action="store_true", help="a 20 MB sanity run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers-list", default="1,2", help="candidate worker counts to time")
    parser.add_argument("--max-vocab", type=int, default=100_000, help="fixed for every run")
    parser.add_argument("--train-files", type=int, default=20)
    parser.add_argument(
        "--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "elmo-bench-prepare"
    )
    parser.add_argument("--keep-corpus", action="store_true", help="keep the cached corpora")
    parser.add_argument(
        "--run-naive", nargs=2, type=Path, metavar=("CORPUS", "OUT"), help="internal: the baseline"
    )
    parser.add_argument("--run-reference-job", type=int, help="internal: the reference job N times")
    args = parser.parse_args(argv)
    if args.quick:
        args.size_mb = 20
    args.workers = [int(n) for n in args.workers_list.split(",")]
    return args


def timed(label: str, command: list[str], out: Path, env: dict[str, str], repeats: int) -> Run:
    """The median run of ``repeats`` (fresh output each; low median), with the worst memory."""
    runs = []
    for _ in range(repeats):
        fresh(out)
        runs.append(measure(command, env))
        print(f"  {label}: {runs[-1].seconds:.2f}s", file=sys.stderr)
    worst = {
        name: max((getattr(r, name) for r in runs if getattr(r, name)), default=None)
        for name in ("main_peak_mb", "child_peak_mb", "tree_peak_mb")
    }
    median = sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]
    return Run(median.seconds, median.cpu_seconds, **worst, phases=median.phases)


def print_table(rows: list[tuple[str, int, Run]]) -> None:
    def mb(value: float | None) -> str:
        return f"{value:,.0f}" if value else "-"

    head = f"{'implementation':<24}{'tokens':>12}{'seconds':>10}{'M tok/s':>9}{'CPU s':>8}"
    print(f"{head}{'main MB':>9}{'child MB':>10}{'tree MB':>9}")
    for label, tokens, run in rows:
        rate = tokens / run.seconds / 1e6
        memory = f"{mb(run.main_peak_mb):>9}{mb(run.child_peak_mb):>10}{mb(run.tree_peak_mb):>9}"
        cpu = f"{run.cpu_seconds:>8.2f}"
        print(f"{label:<24}{tokens:>12,}{run.seconds:>10.2f}{rate:>9.2f}{cpu}{memory}")


def peak(run: Run) -> float:
    """The tree's peak (PSS) where sampled, else the main process's."""
    return run.tree_peak_mb or run.main_peak_mb or float("nan")


def run_all(
    args: argparse.Namespace, corpora: dict[str, Path], work: Path
) -> tuple[list[tuple[str, int, Run]], dict[str, int]]:
    """Check agreement (the warm-up), then time baseline, each worker count, and the x2 corpora."""
    env = {**os.environ, "ELMO_HOME": str(work / "home")}
    base_out, cand_out = fresh(work / "naive"), fresh(work / "prepared")
    naive = naive_command(corpora["x1"], base_out, args.max_vocab)
    measure(naive, env)
    measure(prepare_command(corpora["x1"], cand_out, args.max_vocab, 1), env)
    baseline = read_naive(base_out)
    check_agree(baseline, read_prepared(cand_out))
    print("baseline and candidate agree", file=sys.stderr)
    num_types = {"x1": _num_types(cand_out)}
    tokens = sum(baseline.num_tokens.values())
    rows = [("naive", tokens, timed("naive", naive, base_out, env, args.repeats))]
    for n in args.workers:
        command = prepare_command(corpora["x1"], cand_out, args.max_vocab, n)
        rows.append((f"prepare w{n}", tokens, timed(f"w{n}", command, cand_out, env, args.repeats)))
    for name, label in (
        ("x2 same types", "w1, x2 same types"),
        ("x2 new types", "w1, x2 new types"),
    ):
        command = prepare_command(corpora[name], cand_out, args.max_vocab, 1)
        run = timed(label, command, cand_out, env, 1)
        rows.append((label, sum(read_prepared(cand_out).num_tokens.values()), run))
        num_types[name] = _num_types(cand_out)
    return rows, num_types


def _num_types(dataset: Path) -> int:
    manifest = json.loads((dataset / "manifest.json").read_text(encoding="utf-8"))
    return int(manifest["word_types"]["num_types"])


def reference_job() -> None:
    """~0.3 s of CPU alone (a Python loop, no memory traffic): what two CPUs should do twice."""
    total = 0
    for i in range(4_000_000):
        total += i & 7


def reference_scaling(env: dict[str, str], repeats: int) -> float:
    """Median over ``repeats`` of: the job twice in one process / once in each of two at once."""
    job = [*MODULE, "--run-reference-job"]
    ratios = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([*job, "2"], cwd=REPO, env=env, check=True)
        serial = time.perf_counter() - started
        started = time.perf_counter()
        for process in [subprocess.Popen([*job, "1"], cwd=REPO, env=env) for _ in range(2)]:
            process.wait()
        ratios.append(serial / (time.perf_counter() - started))
    return sorted(ratios)[(len(ratios) - 1) // 2]


PARALLEL_PHASES = ("count", "encode", "shuffle")  # run by the workers; the rest is serial


def phase_scaling(w1: Run, w2: Run | None) -> dict[str, float] | None:
    """Amdahl from prepare's phases: the parallel phases' speed-up, the serial seconds of one
    worker (start-up, imports, vocabulary: the wall time outside the parallel phases) and
    ``T1 / (serial + parallel / 2)``, the most two free cores can give."""
    if w2 is None or not w1.phases or not w2.phases:
        return None
    parallel_1 = sum(w1.phases.get(name, 0.0) for name in PARALLEL_PHASES)
    parallel_2 = sum(w2.phases.get(name, 0.0) for name in PARALLEL_PHASES)
    serial = w1.seconds - parallel_1
    return {
        "parallel_scaling_1_to_2": parallel_1 / parallel_2,
        "serial_seconds": serial,
        "two_core_bound": w1.seconds / (serial + parallel_1 / 2),
    }


def report(
    args: argparse.Namespace,
    rows: list[tuple[str, int, Run]],
    num_types: dict[str, int],
    reference: float,
) -> None:
    """The goals (prepare's speed against a naive script, its memory and its scaling) as
    PASS/MISS lines, context lines, then the JSON last line."""
    tokens, naive, w1 = rows[0][1], rows[0][2], rows[1][2]
    runs = {n: row[2] for n, row in zip(args.workers, rows[1:], strict=False)}
    by_workers = {n: run.seconds for n, run in runs.items()}
    scaling = by_workers[1] / by_workers[2] if {1, 2} <= by_workers.keys() else None
    phases = phase_scaling(runs[1], runs.get(2)) if 1 in runs else None
    same, new = peak(rows[-2][2]) / peak(w1), peak(rows[-1][2]) / peak(w1)
    goals = {
        "ratio >= 5 (one worker)": naive.seconds / w1.seconds >= 5,
        "peak memory flat at x2, fixed vocabulary (<= 1.15x)": same <= 1.15,
        "1 -> 2 workers >= 1.7x": scaling is not None and scaling >= 1.7,
    }
    for goal, met in goals.items():
        print(f"{'PASS' if met else 'MISS'}  {goal}")
    extra_types = num_types["x2 new types"] - num_types["x1"]
    per_type = (peak(rows[-1][2]) - peak(rows[-2][2])) / extra_types * 1e6 if extra_types else 0
    print(
        f"x2 with new types: peak x{new:.2f} ({num_types['x1']:,} -> "
        f"{num_types['x2 new types']:,} types, ~{per_type:.0f} bytes per extra type)"
    )
    print(f"1 -> 2 processes of a CPU-only reference job: {reference:.2f}x on this machine "
          f"now; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    if phases:
        print(
            f"parallel phases ({', '.join(PARALLEL_PHASES)}) 1 -> 2 workers: "
            f"{phases['parallel_scaling_1_to_2']:.2f}x; serial part of one worker "
            f"{phases['serial_seconds']:.2f} of {w1.seconds:.2f} s, so two free cores give at "
            f"most {phases['two_core_bound']:.2f}x"
        )
    result = {
        "benchmark": "prepare",
        "size_mb": args.size_mb,
        "tokens": tokens,
        "max_vocab": args.max_vocab,
        "baseline_seconds": round(naive.seconds, 3),
        "candidate_seconds": round(w1.seconds, 3),
        "ratio": round(naive.seconds / w1.seconds, 2),
        "cpu_ratio": round(naive.cpu_seconds / w1.cpu_seconds, 2),  # less sensitive to load
        "baseline_mtok_per_s": round(tokens / naive.seconds / 1e6, 3),
        "candidate_mtok_per_s": round(tokens / w1.seconds / 1e6, 3),
        "seconds_by_workers": {n: round(t, 3) for n, t in by_workers.items()},
        "scaling_1_to_2": scaling and round(scaling, 2),
        "reference_scaling": round(reference, 2),
        **{name: round(value, 2) for name, value in (phases or {}).items()},
        "baseline_peak_mb": round(peak(naive)),
        "peak_mb_x1": round(peak(w1)),
        "peak_mb_x2_same_types": round(peak(rows[-2][2])),
        "peak_mb_x2_new_types": round(peak(rows[-1][2])),
        "peak_growth_x2_same_types": round(same, 3),
        "peak_growth_x2_new_types": round(new, 3),
        "num_types": num_types,
        "load_average": round(os.getloadavg()[0], 1),
        "goals_met": all(goals.values()),
    }
    print_summary(result)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_naive:
        corpus, out = args.run_naive
        naive_prepare(corpus, out, args.max_vocab)
        return 0
    if args.run_reference_job:
        for _ in range(args.run_reference_job):
            reference_job()
        return 0
    if not any(source_files(args.data_root)):
        print(f"skipping: no ptb/ or text/ under {args.data_root} (pass --data-root)")
        return 0
    started = time.perf_counter()
    size, files, cache = args.size_mb << 20, args.train_files, args.cache_dir
    x1 = build_corpus(args.data_root, size, cache, train_files=files)
    corpora = {
        "x1": x1,
        "x2 same types": doubled_corpus(x1),
        "x2 new types": build_corpus(args.data_root, 2 * size, cache, train_files=2 * files),
    }
    print(f"corpora ready in {time.perf_counter() - started:.1f}s: {corpora}", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        rows, num_types = run_all(args, corpora, work)
        reference = reference_scaling(dict(os.environ), args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for corpus in [] if args.keep_corpus else corpora.values():
            shutil.rmtree(corpus, ignore_errors=True)
    print_table(rows)
    report(args, rows, num_types, reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
