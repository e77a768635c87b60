"""The zero-state trap: what a run's checkpoints do from zero, and what the warm start
changes downstream.

    python -m experiments.zero_state_trap perplexity --data DATASET --run RUN_DIR [RUN_DIR ...]
    python -m experiments.zero_state_trap stateless --data DATASET --bilm MODEL_DIR [MODEL_DIR ...]
    python -m experiments.zero_state_trap adapt --bilm MODEL_DIR [--data-root ../shared/data]
        [--seeds 0,1,2] [--max-train 2000]

``perplexity``: every checkpoint's heldout perplexity, state carried from zero and restarted every
window; ``stateless``: each heldout sentence scored alone, from zero and from the warm start;
``adapt``: three tasks adapted with the biLM starting cold and warm. Last line: one JSON object
with every figure; the method and results in experiments/zero_state_trap-2026-11-27.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import torch
import yaml

from elmo_core.data.batching import window_char_ids
from elmo_core.data.reader import iter_sentences, load_manifest, load_word_types
from elmo_core.model.bilm import BiLM, DirectionOutput
from elmo_core.model.serialization import MODEL_DIR, find_model_dir, read_bilm_dir
from elmo_core.model.warm_start import WARMUP_FILE
from elmo_core.perplexity import evaluate_perplexity
from elmo_core.tasks.task_config import load_task_config

REPO = Path(__file__).resolve().parents[1]
HEAD = {"hidden_dim": 64, "dropout": 0.5}
TRAINING = {"epochs": 5, "batch_size": 32, "lr": 0.003, "patience": 2}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = parser.add_subparsers(dest="part", required=True)
    ppl = parts.add_parser("perplexity")
    ppl.add_argument("--data", required=True, help="the prepared dataset the runs trained on")
    ppl.add_argument("--run", nargs="+", type=Path, required=True, help="run directories")
    stateless = parts.add_parser("stateless")
    stateless.add_argument("--data", required=True, help="the prepared dataset")
    stateless.add_argument("--bilm", nargs="+", type=Path, required=True, help="biLM directories")
    adapt = parts.add_parser("adapt")
    adapt.add_argument("--bilm", type=Path, required=True, help="a biLM directory with warmup.txt")
    adapt.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    adapt.add_argument("--seeds", default="0,1,2")
    adapt.add_argument("--max-train", type=int, default=2000)
    return parser.parse_args()


def checkpoint_rows(data: str, run: Path) -> list[dict[str, object]]:
    """One row per checkpoint of ``run``, in step order."""
    rows = []
    for checkpoint in sorted((run / "checkpoints").glob("step_*")):
        bilm = read_bilm_dir(checkpoint / MODEL_DIR)
        carried = evaluate_perplexity(bilm, data, progress=False)
        cold = evaluate_perplexity(bilm, data, progress=False, carry_state=False)
        rows.append(
            {
                "run": run.name,
                "step": int(checkpoint.name.split("_")[-1]),
                "forward": carried.forward_perplexity,
                "backward": carried.backward_perplexity,
                "ratio": carried.forward_perplexity / carried.backward_perplexity,
                "forward_every_window": cold.forward_perplexity,
                "backward_every_window": cold.backward_perplexity,
                "trapped_forward": carried.forward_trapped,
                "trapped_backward": carried.backward_trapped,
                "trapped_forward_every_window": cold.forward_trapped,
                "rows": carried.num_rows,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def perplexity_part(args: argparse.Namespace) -> dict[str, object]:
    rows = [row for run in args.run for row in checkpoint_rows(args.data, run)]
    print(
        "\n| run | step | forward | backward | f/b | forward, zero every window | "
        "backward, zero every window | trapped rows f / b (of B) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['step']} | {r['forward']:.1f} | {r['backward']:.1f} | "
            f"{r['ratio']:.2f} | {r['forward_every_window']:.1f} | "
            f"{r['backward_every_window']:.1f} | {r['trapped_forward']} / "
            f"{r['trapped_backward']} (of {r['rows']}) |"
        )
    return {"checkpoints": rows}


def sentence_nll(bilm: BiLM, data: str, warm: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per heldout sentence: forward and backward NLL sums ``(S,)``, token counts ``(S,)``, from
    the zero state or the warm start, and whether it opens with a non-alphanumeric token."""
    manifest = load_manifest(data)
    types = load_word_types(data, manifest)
    sentences = [
        (batch.types[start:end], batch.targets[start:end])
        for batch in iter_sentences(data, "heldout", manifest=manifest)
        for start, end in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]
    opens = np.array([not types.tokens[int(t[0])].as_py()[:1].isalnum() for t, _ in sentences])
    sums, counts = np.zeros((2, len(sentences))), np.zeros(len(sentences))
    bilm.eval()
    for first in range(0, len(sentences), 128):
        chunk = sentences[first : first + 128]
        width = max(len(t) for t, _ in chunk) + 1
        inputs = np.full((2, len(chunk), width), -1)  # (2, B, T): forward, backward
        targets = np.full((2, len(chunk), width), -1)
        for row, (tokens, vocab_ids) in enumerate(chunk):
            n = len(tokens)
            inputs[0, row, : n + 1] = [0, *tokens]  # <S> w1 .. wn
            targets[0, row, : n + 1] = [*vocab_ids, 1]  # w1 .. wn </S>
            inputs[1, row, : n + 1] = [1, *tokens[::-1]]  # </S> wn .. w1
            targets[1, row, : n + 1] = [*vocab_ids[::-1], 0]
        ids = [torch.from_numpy(window_char_ids(i, types.char_ids)) for i in inputs]
        goals = [torch.from_numpy(t) for t in targets]
        start = bilm.start_state(len(chunk), torch.float32) if warm else None
        with torch.no_grad():
            scored = bilm.score_window(
                ids[0], goals[0], ids[1], goals[1], partial(_row_nll, bilm), start
            )
        for direction in range(2):
            sums[direction, first : first + len(chunk)] = scored[direction].numpy()
        counts[first : first + len(chunk)] = (targets[0] >= 0).sum(1)
    return sums, counts, opens


def _row_nll(bilm: BiLM, output: DirectionOutput, targets: torch.Tensor) -> torch.Tensor:
    """``(B,)`` summed full-softmax NLL of each row's scored positions."""
    assert bilm.softmax is not None
    scored = output.scored(targets)  # (B, T)
    nll = torch.zeros(targets.shape, dtype=torch.float64)
    nll[scored] = bilm.softmax.nll(output.top[scored], targets[scored]).double()
    return nll.sum(dim=1)


def stateless_part(args: argparse.Namespace) -> dict[str, object]:
    rows = []
    for model in args.bilm:
        bilm = read_bilm_dir(find_model_dir(model))
        if bilm.start_state(1, torch.float32) is None:
            sys.exit(f"{model} has no {WARMUP_FILE}: nothing to compare")
        for start in ("zero", "warm"):
            sums, counts, opens = sentence_nll(bilm, args.data, start == "warm")
            for subset, keep in (("all", np.ones_like(opens)), ("opening with a quote", opens)):
                f, b = (math.exp(sums[d, keep].sum() / counts[keep].sum()) for d in range(2))
                row = {"bilm": str(model), "start": start, "sentences": subset}
                rows.append(row | {"count": int(keep.sum()), "forward": f, "backward": b})
                print(json.dumps(rows[-1]), flush=True)
    print("\n| biLM | start | sentences | forward | backward |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['bilm']} | {r['start']} | {r['sentences']} ({r['count']}) | "
            f"{r['forward']:.1f} | {r['backward']:.1f} |"
        )
    return {"stateless": rows}


def write_tasks(data_root: Path, work: Path, max_train: int) -> list[Path]:
    """Task configs over subsets of the real sets, written under ``work``."""
    shuffle = random.Random(0)
    configs = {"pos": {"type": "tagging", "format": "conllu"}}
    for split, limit in (("train", max_train), ("dev", 500), ("test", 1000)):
        text = (data_root / "ud_ewt" / f"en_ewt-ud-{split}.conllu").read_text(encoding="utf-8")
        path = work / f"pos.{split}.conllu"
        path.write_text("\n\n".join(text.strip().split("\n\n")[:limit]) + "\n\n", encoding="utf-8")
        configs["pos"][split] = str(path)
    subj = _lines(data_root / "cls" / "subj.all")
    shuffle.shuffle(subj)
    splits = {"test": subj[:1000], "dev": subj[1000:1500], "train": subj[1500 : 1500 + max_train]}
    configs["subj"] = _label_text(work, "subj", splits)
    trec = _lines(data_root / "cls" / "TREC.train.all")  # coarse labels, 0-5
    shuffle.shuffle(trec)
    test = _lines(data_root / "cls" / "TREC.test.all")
    splits = {"train": trec[:max_train], "dev": trec[max_train : max_train + 500]}
    configs["trec"] = _label_text(work, "trec", splits | {"test": test})
    paths = []
    for name, config in configs.items():
        path = work / f"{name}.yaml"
        body = {"name": name, **config, "head": HEAD, "training": TRAINING}
        path.write_text(yaml.safe_dump(body), encoding="utf-8")
        paths.append(path)
    return paths


def _lines(path: Path) -> list[str]:
    """A Latin-1 file's lines (split at newlines only: Latin-1 text holds other breaks)."""
    return [line for line in path.read_text(encoding="latin-1").split("\n") if line.strip()]


def _label_text(work: Path, name: str, splits: dict[str, list[str]]) -> dict[str, str]:
    config = {"type": "classification", "format": "label_text"}
    for split, lines in splits.items():
        path = work / f"{name}.{split}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        config[split] = str(path)
    return config


def adapt_part(args: argparse.Namespace) -> dict[str, object]:
    from pipelines.adapt.stage import adapt

    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        tasks = [
            load_task_config(path) for path in write_tasks(args.data_root, work, args.max_train)
        ]
        warm = find_model_dir(args.bilm)
        if not (warm / WARMUP_FILE).is_file():
            sys.exit(f"{warm} has no {WARMUP_FILE}: nothing to compare")
        cold = shutil.copytree(warm, work / "cold", ignore=shutil.ignore_patterns(WARMUP_FILE))
        scores: dict[str, dict[str, object]] = {}
        for start, model in (("cold", cold), ("warm", warm)):
            for result in adapt(tasks, str(model), seeds=seeds):
                scores[f"{result.task}/{start}"] = {
                    "elmo": statistics.mean(result.elmo_scores),
                    "elmo_sd": statistics.stdev(result.elmo_scores) if len(seeds) > 1 else 0.0,
                    "baseline": statistics.mean(result.baseline_scores),
                    "per_seed": result.elmo_scores,
                }
    print("\n| task | ELMo, zero start | ELMo, warm start | warm − zero | baseline |")
    print("|---|---|---|---|---|")
    for task in ("pos", "subj", "trec"):
        c, w = scores[f"{task}/cold"], scores[f"{task}/warm"]
        print(
            f"| {task} | {c['elmo']:.4f} ± {c['elmo_sd']:.4f} | {w['elmo']:.4f} ± "
            f"{w['elmo_sd']:.4f} | {w['elmo'] - c['elmo']:+.4f} | {c['baseline']:.4f} |"  # type: ignore[operator]
        )
    return {"adapt": scores, "bilm": str(args.bilm), "seeds": seeds}


def main() -> int:
    args = parse_args()
    torch.manual_seed(0)
    part = {"perplexity": perplexity_part, "stateless": stateless_part, "adapt": adapt_part}
    figures = part[args.part](args)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
