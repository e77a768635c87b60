"""Perplexity protocols on real text: bilm-tf's one token per step against 20-token windows.

    python -m benchmarks.bench_eval_protocols [--data-root ../shared/data] [--train-steps 100]
        [--test-sentences 600] [--repeats 3] [--threads 2]

Trains a small biLM briefly on PTB, then scores PTB's test file with 256 rows × 1 token a step
(bilm-tf's test step, the baseline) and 256 × 20 (the same streams, so the numbers must agree);
also bilm-tf's ``original`` protocol and our default ``batched`` one, to show what the choice of
protocol does to the reported number. Last line: one JSON object, ``ratio = baseline_seconds /
candidate_seconds``. Results: benchmarks/results/bench_eval_protocols-2026-11-21.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import print_summary, seconds_per_call
from elmo_core.config import CharCNNConfig, LSTMConfig, ModelConfig, PrepareConfig
from elmo_core.data.batching import TokenStream, window_char_ids
from elmo_core.data.reader import load_manifest, load_word_types
from elmo_core.model.bilm import BiLM
from elmo_core.perplexity import PerplexitySums, evaluate_perplexity
from pipelines.prepare.corpus_sources import (
    HELDOUT_DIR,
    SAMPLE_CORPUS,
    TRAIN_DIR,
    CorpusFiles,
    locate_corpus,
)
from pipelines.prepare.stage import prepare_files

REPO = Path(__file__).resolve().parents[1]
TEST_FILE = "heldout-00000"  # ptb.test.txt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--train-steps", type=int, default=100, help="0: random init")
    parser.add_argument("--test-sentences", type=int, default=600, help="0: the whole test file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def prepare_ptb(ptb: Path, work: Path, test_sentences: int) -> str:
    """PTB as a 1B-Word-like layout, prepared with the whitespace tokenizer (keeps ``<unk>``).

    The test file is cut to its first ``test_sentences`` lines (0: all of it) so a CPU run stays
    short; train and valid are linked as they are.
    """
    train = work / TRAIN_DIR / "news.en-00001-of-00100"
    test = work / HELDOUT_DIR / "news.en.heldout-00000-of-00050"
    valid = work / HELDOUT_DIR / "news.en.heldout-00001-of-00050"
    for path in (train, test, valid):
        path.parent.mkdir(parents=True, exist_ok=True)
    train.symlink_to((ptb / "ptb.train.txt").resolve())
    valid.symlink_to((ptb / "ptb.valid.txt").resolve())
    lines = (ptb / "ptb.test.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    test.write_text("".join(lines[:test_sentences] if test_sentences else lines), encoding="utf-8")
    corpus = CorpusFiles(str(ptb), "1b-benchmark", [train], [test, valid])
    out = work / "dataset"
    prepare_files(PrepareConfig(format="1b-benchmark"), corpus, str(out))
    return str(out)


def prepare_benchmark_corpus(corpus: str, ptb: Path, work: Path, test_sentences: int) -> str:
    """``ptb`` (as :func:`prepare_ptb`) or the bundled sample corpus (needs no data: for a GPU
    machine), prepared under ``work``."""
    if corpus == "ptb":
        return prepare_ptb(ptb, work, test_sentences)
    files = locate_corpus(SAMPLE_CORPUS, "text", work / "cache")
    out = work / "dataset"
    prepare_files(PrepareConfig(format="text"), files, str(out))
    return str(out)


def small_config() -> ModelConfig:
    return ModelConfig(
        char_cnn=CharCNNConfig(filters=[(1, 16), (2, 16), (3, 32), (4, 64)], num_highway=1),
        lstm=LSTMConfig(cell_dim=256, projection_dim=64),
        num_samples=1024,
    )


def train_briefly(bilm: BiLM, dataset: str, steps: int) -> float:
    """bilm-tf's recipe in miniature (Adagrad 0.2, clip 10, loss × T); the last sampled loss."""
    batch_size, unroll = 16, 20
    streams = [
        TokenStream(dataset, batch_size=batch_size, unroll_steps=unroll, seed=seed, reverse=reverse)
        for seed, reverse in ((0, False), (1, True))
    ]
    char_table = load_word_types(dataset).char_ids
    optimizer = torch.optim.Adagrad(bilm.parameters(), lr=0.2, initial_accumulator_value=1.0)
    bilm.train()
    state, loss = None, float("nan")
    for _ in range(steps):
        windows = [stream.next_window() for stream in streams]
        tensors = []
        for window in windows:
            assert window is not None  # training streams repeat
            tensors.append(torch.from_numpy(window_char_ids(window.inputs, char_table)))
            tensors.append(torch.from_numpy(window.targets))
        output, state = bilm.training_loss(*tensors, state=state)
        state = (state[0].detach(), state[1].detach())
        optimizer.zero_grad()
        (output.loss * unroll).backward()
        torch.nn.utils.clip_grad_norm_(bilm.parameters(), 10.0)
        optimizer.step()
        loss = float(output.loss.detach())
    return loss


def timed(bilm: BiLM, dataset: str, repeats: int, **kwargs: object) -> tuple[PerplexitySums, float]:
    """The sums and the median wall time of ``repeats`` evaluations of the test file."""
    sums = [PerplexitySums()]

    def evaluate() -> None:
        sums[0] = evaluate_perplexity(bilm, dataset, files=[TEST_FILE], progress=False, **kwargs)  # type: ignore[arg-type]

    seconds = seconds_per_call(evaluate, repeats, warmup=0)
    return sums[0], seconds


def main() -> int:
    args = parse_args()
    ptb = args.data_root / "ptb"
    if not (ptb / "ptb.train.txt").is_file():
        print(f"skipped: no PTB under {args.data_root} (pass --data-root)")
        print_summary({"benchmark": "eval_protocols", "skipped": True})
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as work:
        dataset = prepare_ptb(ptb, Path(work), args.test_sentences)
        bilm = BiLM(small_config(), load_manifest(dataset).vocab.size)
        started = time.perf_counter()
        last_loss = train_briefly(bilm, dataset, args.train_steps)
        train_seconds = time.perf_counter() - started
        evaluate_perplexity(bilm, dataset, files=[TEST_FILE], max_windows=3, progress=False)
        baseline, baseline_s = timed(bilm, dataset, args.repeats, batch_size=256, unroll_steps=1)
        candidate, candidate_s = timed(bilm, dataset, args.repeats, batch_size=256, unroll_steps=20)
        original, original_s = timed(bilm, dataset, 1, protocol="original")
        default, default_s = timed(bilm, dataset, 1)
    agree = abs(candidate.perplexity / baseline.perplexity - 1) < 1e-4
    rows = [
        ("256 x 1 (baseline)", baseline, baseline_s),
        ("256 x 20 (candidate)", candidate, candidate_s),
        ("original 256 x 1, tail dropped", original, original_s),
        ("batched 128 x 20 (default)", default, default_s),
    ]
    model = f"trained {args.train_steps} steps" if args.train_steps else "random init"
    print(
        f"PTB test, small biLM ({model}, last sampled loss {last_loss:.3f}, "
        f"{train_seconds:.0f}s of training)"
    )
    print(f"{'protocol':34s} {'tokens':>8s} {'fwd ppl':>9s} {'bwd ppl':>9s} {'ppl':>9s} {'s':>7s}")
    for name, sums, seconds in rows:
        print(
            f"{name:34s} {sums.num_tokens:8d} {sums.forward_perplexity:9.3f} "
            f"{sums.backward_perplexity:9.3f} {sums.perplexity:9.3f} {seconds:7.2f}"
        )
    print(
        f"baseline and candidate agree: {agree}; original vs default: "
        f"{original.perplexity / default.perplexity - 1:+.4%}"
    )
    print_summary(
        {
            "benchmark": "eval_protocols",
            "data": f"ptb.test[:{args.test_sentences or 'all'}]",
            "model": model,
            "agree": agree,
            "baseline_seconds": round(baseline_s, 3),
            "candidate_seconds": round(candidate_s, 3),
            "ratio": round(baseline_s / candidate_s, 2),
            "perplexity_one_token": baseline.perplexity,
            "perplexity_windows": candidate.perplexity,
            "perplexity_original": original.perplexity,
            "perplexity_batched": default.perplexity,
            "tokens_original": original.num_tokens,
            "tokens_batched": default.num_tokens,
        }
    )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
