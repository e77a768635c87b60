"""CPU inference of the frozen biLM: tokens/s of our two LSTM loops against a baseline.

    python -m benchmarks.bench_inference               # the default settings, then two under load
    python -m benchmarks.bench_inference --settings original:32:2 --loaded ""
    python -m benchmarks.bench_inference --smoke       # tiny, made-up sentences (tested in CI)

CPU inference: the path ``elmo embed`` takes, on PTB's test sentences, for
``baseline`` (``bench_bilm.StraightforwardBiLM``, structured as AllenNLP's ``_ElmoBiLm``),
``reference`` and ``fused``, checked to agree, then timed in turn. Last line: one JSON object;
``ratio`` = baseline / fused seconds at ``--goal`` (no load), where the issue asks for ≥ 5.
Method and results: benchmarks/results/bench_inference-2026-11-25.md and -2026-11-26.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.bench_bilm import StraightforwardBiLM
from benchmarks.bench_threads_under_load import competing_load
from benchmarks.harness import check_agreement, print_summary, time_in_turn
from elmo_core.model.bilm import BiLM
from elmo_core.presets import model_preset
from elmo_core.text.char_ids import batch_to_ids

REPO = Path(__file__).resolve().parents[1]
MODELS = ("baseline", "reference", "fused")
SMOKE_SENTENCES = [  # made up, of mixed lengths, so that the smoke run needs no data
    sentence.split()
    for sentence in (
        "the cat sat on the mat",
        "hi",
        "a much longer sentence than that one , with a comma",
        "colourless green ideas sleep furiously",
        "N dollars",
    )
]
Models = dict[str, Callable[[torch.Tensor], torch.Tensor]]  # char ids -> top layer (B, T+2, 2P)


class Setting(NamedTuple):
    """``preset:B:threads[:length]``."""

    preset: str
    batch: int
    threads: int
    by_length: bool

    @staticmethod
    def parse(text: str) -> Setting:
        preset, batch, threads, *order = text.split(":")
        return Setting(preset, int(batch), int(threads), order == ["length"])

    @property
    def key(self) -> str:
        return f"{self.preset}_{self.batch}_t{self.threads}" + ("_length" if self.by_length else "")


def read_sentences(path: Path, limit: int) -> list[list[str]]:
    """The first ``limit`` non-empty lines of a tokenized corpus, as token lists."""
    sentences = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.split():
                sentences.append(line.split())
            if len(sentences) == limit:
                break
    return sentences


def batches(sentences: list[list[str]], size: int, by_length: bool) -> list[torch.Tensor]:
    """Char ids ``(B, T, W)`` of consecutive batches, in file order or sorted by length."""
    ordered = sorted(sentences, key=len) if by_length else sentences
    return [batch_to_ids(ordered[start : start + size]) for start in range(0, len(ordered), size)]


def build_models(preset: str) -> Models:
    """The three models on one set of weights (dropout 0, eval mode)."""
    config = model_preset(preset).model_copy(update={"dropout": 0.0})
    torch.manual_seed(0)
    reference = BiLM(config.model_copy(update={"lstm_impl": "reference"})).eval()
    fused = BiLM(config.model_copy(update={"lstm_impl": "fused"})).eval()
    fused.load_state_dict(reference.state_dict())
    baseline = StraightforwardBiLM(reference)
    return {
        "baseline": lambda ids: baseline(ids)[-1],
        "reference": lambda ids: reference(ids).activations[-1],
        "fused": lambda ids: fused(ids).activations[-1],
    }


def max_differences(models: Models, ids: torch.Tensor) -> dict[str, float]:
    """Each of ours against the baseline: the largest absolute difference of the top layer."""
    with torch.inference_mode():
        tops = {name: run(ids) for name, run in models.items()}
    return {
        name: float((tops[name] - tops["baseline"]).abs().max()) for name in ("reference", "fused")
    }


def time_setting(
    models: Models, inputs: list[torch.Tensor], threads: int, rounds: int, warmup: int
) -> dict[str, float]:
    """Seconds of one pass over ``inputs`` per model, ``threads`` torch threads: the sum over the
    batches of each batch's median, the models taking turns batch by batch, so that a burst of
    other work on the machine falls on all of them alike."""

    def on(run: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> Callable[[], None]:
        def call() -> None:
            with torch.inference_mode():
                run(ids)

        return call

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        medians = [
            time_in_turn({name: on(models[name], ids) for name in MODELS}, rounds, warmup)
            for ids in inputs
        ]
    finally:
        torch.set_num_threads(before)
    return {name: sum(batch[name] for batch in medians) for name in MODELS}


def run_settings(
    settings: list[Setting],
    sentences: list[list[str]],
    args: argparse.Namespace,
    built: dict[str, Models],
) -> dict[Setting, dict[str, float]]:
    """Tokens/s of each model per setting; each preset's models are built and checked once."""
    tokens = sum(len(sentence) for sentence in sentences)
    rates = {}
    for setting in settings:
        if setting.preset not in built:
            built[setting.preset] = build_models(setting.preset)
            differences = max_differences(built[setting.preset], batch_to_ids(sentences[:8]))
            print(f"{setting.preset}: top layer, max |ours - baseline|: {differences}")
            check_agreement(differences, args.tolerance, f"{setting.preset}: the models")
        inputs = batches(sentences, setting.batch, setting.by_length)
        seconds = time_setting(
            built[setting.preset], inputs, setting.threads, args.rounds, args.warmup
        )
        rates[setting] = {name: tokens / value for name, value in seconds.items()}
    return rates


def print_table(title: str, rates: dict[Setting, dict[str, float]]) -> None:
    print(title)
    header = f"{'setting':22}" + "".join(f" {name + ' tok/s':>16}" for name in MODELS)
    print(header + f" {'ref/base':>9} {'fused/base':>11} {'fused/ref':>10}")
    for setting, rate in rates.items():
        name = ":".join(map(str, setting[:3])) + (":length" if setting.by_length else "")
        line = f"{name:22}" + "".join(f" {rate[model]:16,.0f}" for model in MODELS)
        ratios = (rate["reference"] / rate["baseline"], rate["fused"] / rate["baseline"])
        print(
            line
            + f" {ratios[0]:8.2f}x {ratios[1]:10.2f}x {rate['fused'] / rate['reference']:9.2f}x"
        )


def summarize(
    rates: dict[Setting, dict[str, float]], suffix: str, summary: dict[str, object]
) -> None:
    for setting, rate in rates.items():
        key = setting.key + suffix
        for name in MODELS:
            summary[f"{key}_{name}_tokens_per_s"] = round(rate[name], 1)
        summary[f"{key}_ratio_fused"] = round(rate["fused"] / rate["baseline"], 3)
        summary[f"{key}_ratio_reference"] = round(rate["reference"] / rate["baseline"], 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--corpus", default="ptb/ptb.test.txt", help="under --data-root")
    parser.add_argument("--sentences", type=int, default=128, help="sentences per pass")
    parser.add_argument(
        "--settings",
        default="small:32:1,small:32:2,small:128:1,small:128:2,small:32:1:length",
        help="preset:B:threads[:length], comma-separated",
    )
    parser.add_argument("--loaded", default="small:32:1,small:32:2", help="again, under load")
    parser.add_argument(
        "--loaded-sentences", type=int, default=32, help="the first sentences, under load"
    )
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside --loaded")
    parser.add_argument("--goal", default="small:32:2", help="the setting of the issue's goal")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per model")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest difference allowed")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.settings, args.loaded, args.goal, args.hogs = "tiny:2:1", "tiny:4:1", "tiny:2:1", 1
        args.rounds, args.warmup, args.loaded_sentences = 1, 0, 4
        sentences = SMOKE_SENTENCES
    else:
        corpus = args.data_root / args.corpus
        if not corpus.is_file():
            print(f"skipped: {corpus} not found (pass --data-root)")
            return 0
        sentences = read_sentences(corpus, args.sentences)
    settings = [Setting.parse(text) for text in args.settings.split(",") if text]
    loaded_settings = [Setting.parse(text) for text in args.loaded.split(",") if text]
    started, built = time.perf_counter(), dict[str, Models]()
    load_before = os.getloadavg()
    quiet = run_settings(settings, sentences, args, built)
    load_quiet = os.getloadavg()
    loaded: dict[Setting, dict[str, float]] = {}
    if loaded_settings:
        with competing_load(args.hogs, "spin"):
            loaded = run_settings(loaded_settings, sentences[: args.loaded_sentences], args, built)
            load_loaded = os.getloadavg()
    tokens = sum(len(sentence) for sentence in sentences)
    print(
        f"CPU inference, {len(sentences)} sentences ({tokens:,} tokens) a pass, each batch's "
        f"median of {args.rounds} after {args.warmup} warm-up, models in turn; "
        f"{os.cpu_count()} CPUs, "
        f"torch {torch.__version__}; load average (1 min) {load_before[0]:.2f} before, "
        f"{load_quiet[0]:.2f} after the runs without load; {time.perf_counter() - started:.0f} s"
    )
    print_table("without added load", quiet)
    summary: dict[str, object] = {
        "benchmark": "inference",
        "sentences": len(sentences),
        "tokens": tokens,
        "rounds": args.rounds,
        "loadavg_1min_before": round(load_before[0], 2),
        "loadavg_1min_after": round(load_quiet[0], 2),
    }
    summarize(quiet, "", summary)
    if loaded:
        loaded_tokens = sum(len(sentence) for sentence in sentences[: args.loaded_sentences])
        print_table(
            f"beside {args.hogs} busy processes, the first {args.loaded_sentences} sentences "
            f"({loaded_tokens:,} tokens) a pass; load {load_loaded[0]:.2f} at the end",
            loaded,
        )
        summarize(loaded, "_loaded", summary)
        summary["loadavg_1min_loaded"] = round(load_loaded[0], 2)
    goal = Setting.parse(args.goal)
    if goal in quiet:
        ratio = quiet[goal]["fused"] / quiet[goal]["baseline"]
        verdict = "met" if ratio >= 5 else "NOT met"
        print(f"goal: fused >= 5x baseline at {args.goal}: {ratio:.2f}x, {verdict}")
        summary["ratio"] = round(ratio, 3)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
