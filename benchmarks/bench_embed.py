"""``elmo embed`` throughput: the stage's Ray actor pool against one process calling the biLM.

The baseline is what AllenNLP's ``elmo`` command and bilm-tf's ``dump_bilm_embeddings`` do: one
process, batches in input order. The candidate is :func:`pipelines.embed.stage.embed` on a local
Ray, timed end to end as a user runs it. Both embed the same book sentences with the same biLM
(random weights: the speed does not depend on them), every layer, checked to agree first; without
``<data-root>/text`` it skips. Last line: one JSON object; ``ratio = baseline_seconds /
candidate_seconds``. Results: benchmarks/results/bench_embed-2026-11-25.md.

    python -m benchmarks.bench_embed --sentences 2000 --preset small --workers 2
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from benchmarks.harness import print_summary, time_in_turn
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import model_preset
from elmo_core.text.char_ids import batch_to_ids
from elmo_core.text.tokenize import MosesTokenizer
from pipelines.embed.embedding_shards import table_vectors

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--preset", default="small", help="biLM size (tiny, small, ...)")
    parser.add_argument("--workers", type=int, default=2, help="Ray actors (one CPU each)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sentences-per-shard", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def load_sentences(text_dir: Path, limit: int) -> list[list[str]]:
    """The first ``limit`` sentences of the books under ``text_dir``: paragraphs (blank-line
    separated, hard-wrapped lines joined), split and tokenized by the Moses tokenizer."""
    tokenizer = MosesTokenizer()
    sentences: list[list[str]] = []
    for path in sorted(p for p in text_dir.rglob("*.txt") if p.is_file()):
        for paragraph in path.read_text(encoding="utf-8").split("\n\n"):
            sentences += [s for s in tokenizer.tokenize(" ".join(paragraph.split())) if s]
            if len(sentences) >= limit:
                return sentences[:limit]
    return sentences


def baseline(bilm: BiLM, sentences: list[list[str]], batch_size: int) -> list[np.ndarray]:
    """Every layer of each sentence, ``(L, T, 2P)``, by one process in input order."""
    vectors = []
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start : start + batch_size]
        with torch.inference_mode():
            layers = torch.stack(bilm(batch_to_ids(batch)).activations, dim=1)  # (B, L, T+2, 2P)
        vectors += [layers[row, :, 1 : 1 + len(s)].numpy().copy() for row, s in enumerate(batch)]
    return vectors


def read_output(out: str) -> list[np.ndarray]:
    """The candidate's vectors, by sentence id."""
    rows: dict[int, np.ndarray] = {}
    for shard in sorted(Path(out).glob("part-*.parquet")):
        table = pq.read_table(shard)
        ids = table.column("sentence_id").to_pylist()
        rows |= dict(zip(ids, table_vectors(table, "all"), strict=True))
    return [rows[index] for index in sorted(rows)]


def max_difference(left: list[np.ndarray], right: list[np.ndarray]) -> float:
    assert [a.shape for a in left] == [b.shape for b in right], "outputs differ in shape"
    return max(float(np.abs(a - b).max(initial=0.0)) for a, b in zip(left, right, strict=True))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text_dir = args.data_root / "text"
    if not text_dir.is_dir():
        print(f"skipped: no text/ under {args.data_root}")
        print_summary({"benchmark": "embed", "skipped": True})
        return 0
    sentences = load_sentences(text_dir, args.sentences)
    num_tokens = sum(len(s) for s in sentences)
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as scratch:
        work = Path(scratch)
        os.environ["ELMO_HOME"] = str(work / "home")  # its own MLflow store and Ray files
        (work / "in.txt").write_text("".join(" ".join(s) + "\n" for s in sentences))
        torch.manual_seed(0)
        bilm = BiLM(model_preset(args.preset)).eval()
        model_dir = write_bilm_dir(bilm, work / "bilm")
        summary = measure(args, work, bilm, str(model_dir), sentences)
    summary |= {"sentences": len(sentences), "tokens": num_tokens, "preset": args.preset}
    report(summary, args)
    return 0


def measure(
    args: argparse.Namespace, work: Path, bilm: BiLM, model_dir: str, sentences: list[list[str]]
) -> dict[str, object]:
    """Warm up, check the two agree, then the median seconds of each over the repeats."""
    from pipelines.common.ray_cluster import connect_ray
    from pipelines.embed.stage import embed

    def candidate(name: str) -> str:
        return embed(
            model_dir,
            str(work / "in.txt"),
            str(work / name),
            tokenized=True,
            concurrency=args.workers,
            batch_size=args.batch_size,
            sentences_per_shard=args.sentences_per_shard,
        ).out

    started = time.perf_counter()
    connect_ray(num_cpus=args.workers)
    ray_seconds = time.perf_counter() - started
    reference = baseline(bilm, sentences, args.batch_size)  # also the baseline's warm-up
    difference = max_difference(reference, read_output(candidate("warm-up")))
    runs = itertools.count()  # each of the candidate's runs writes a folder of its own
    seconds = time_in_turn(
        {
            "baseline": lambda: baseline(bilm, sentences, args.batch_size),
            "candidate": lambda: candidate(f"run-{next(runs)}"),
        },
        args.repeats,
        warmup=0,  # both warmed up above
    )
    return {
        "baseline_seconds": round(seconds["baseline"], 3),
        "candidate_seconds": round(seconds["candidate"], 3),
        "ray_start_seconds": round(ray_seconds, 3),
        "max_abs_diff": difference,
        "workers": args.workers,
        "torch_threads": torch.get_num_threads(),
    }


def report(summary: dict[str, object], args: argparse.Namespace) -> None:
    """A small table, then the JSON line."""
    base, cand = float(summary["baseline_seconds"]), float(summary["candidate_seconds"])  # type: ignore[arg-type]
    num = int(summary["sentences"])  # type: ignore[call-overload]
    summary["ratio"] = round(base / cand, 3)
    rows = [
        (f"one process, {summary['torch_threads']} torch threads", base),
        (f"elmo embed, {args.workers} Ray actors", cand),
    ]
    print(f"{num} sentences, {summary['tokens']} tokens, preset {args.preset}")
    print(f"{'':36} {'seconds':>9} {'sentences/s':>12}")
    for label, seconds in rows:
        print(f"{label:36} {seconds:9.2f} {num / seconds:12.1f}")
    print(f"outputs agree: max |difference| {summary['max_abs_diff']:.1e}")
    print_summary({"benchmark": "embed", **summary})


if __name__ == "__main__":
    sys.exit(main())
