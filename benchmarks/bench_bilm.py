"""biLM speed on real text: our model against a straightforward implementation of the same maths.

The straightforward model (below, sharing the candidate's weights) is what a first PyTorch port
looks like: the char CNN at every position over all 50 char slots, and ``[x_t; h]·W + b`` inside
each LSTM layer's per-step loop. Both are checked to agree, then timed on PTB: training steps,
inference, a per-component breakdown, and the full softmax's peak memory (the method:
benchmarks/results/bench_bilm_session2-2026-11-21.md).

    python -m benchmarks.bench_bilm --presets small,original

Last line: one JSON object; ``ratio = baseline_seconds / candidate_seconds``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.harness import check_agreement, print_summary, time_in_turn
from elmo_core.model.bilm import BiLM, gather_positions, reversal_index
from elmo_core.model.softmax import SampledSoftmax
from elmo_core.presets import model_preset
from elmo_core.text.char_ids import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, batch_to_ids, tokens_to_ids

RESULTS = Path(__file__).parent / "results"
Batch = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------- data


def read_ptb(path: Path, batch: int, window: int) -> tuple[Batch, torch.Tensor, int]:
    """Training windows (two streams), an inference batch of sentences and the vocabulary size."""
    sentences = [line.split() for line in path.read_text().splitlines() if line.split()]
    counts = Counter(token for sentence in sentences for token in sentence)
    words = [BOS_TOKEN, EOS_TOKEN, UNK_TOKEN] + [w for w, _ in counts.most_common()]
    ids = {word: index for index, word in enumerate(words)}

    def stream(row: int, reverse: bool) -> list[str]:
        tokens: list[str] = []
        for sentence in sentences[row :: batch * 7 if reverse else batch]:
            body = list(reversed(sentence)) if reverse else sentence
            ends = [EOS_TOKEN, BOS_TOKEN] if reverse else [BOS_TOKEN, EOS_TOKEN]
            tokens += [ends[0], *body, ends[1]]
            if len(tokens) > window:
                return tokens[: window + 1]
        raise ValueError("corpus too small for the batch")

    windows: Batch = {}
    for name, reverse in (("forward", False), ("backward", True)):
        rows = [stream(row + (batch if reverse else 0), reverse) for row in range(batch)]
        windows[f"{name}_inputs"] = torch.stack(
            [torch.from_numpy(tokens_to_ids(row[:window])).long() for row in rows]
        )  # (B, T, W)
        windows[f"{name}_targets"] = torch.tensor(
            [[ids.get(token, ids[UNK_TOKEN]) for token in row[1:]] for row in rows]
        )  # (B, T)
    inference = batch_to_ids([sentence[:window] for sentence in sentences[:batch]])  # (B, ≤T, W)
    return windows, inference, len(words)


# ----------------------------------------------------------------------------- baseline


class StraightforwardBiLM(nn.Module):
    """The same biLM computed the plain way, reading the candidate's parameters."""

    def __init__(self, model: BiLM) -> None:
        super().__init__()
        self.model = model

    def char_cnn(self, char_ids: torch.Tensor) -> torch.Tensor:
        """``(..., W) -> (..., P)``: every position, all W char slots."""
        encoder = self.model.token_encoder
        flat = char_ids.reshape(-1, char_ids.shape[-1])  # (N, W)
        chars = encoder.char_embedding(flat).transpose(1, 2)  # (N, E, W)
        pooled = [encoder.activation(conv(chars).amax(dim=-1)) for conv in encoder.convolutions]
        x = torch.cat(pooled, dim=-1)  # (N, F)
        for transform, carry in zip(encoder.highway.transform, encoder.highway.carry, strict=True):
            gate = torch.sigmoid(carry(x))
            x = gate * torch.relu(transform(x)) + (1.0 - gate) * x
        return encoder.projection(x).reshape(*char_ids.shape[:-1], -1)  # (..., P)

    def lstm(self, stack: nn.Module, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Top layer output ``(B, T, P)`` of a per-step loop, input GEMM inside the loop."""
        config = self.model.config.lstm
        layer_input = inputs  # (B, T, I)
        for index, layer in enumerate(stack.layers):
            weight = torch.cat([layer.input_weight, layer.recurrent_weight], dim=1)  # (4H, I+P)
            h = inputs.new_zeros(inputs.shape[0], config.projection_dim)  # (B, P)
            c = inputs.new_zeros(inputs.shape[0], config.cell_dim)  # (B, H)
            outputs = []
            for t in range(inputs.shape[1]):
                gates = torch.cat([layer_input[:, t], h], dim=1) @ weight.t() + layer.bias
                i, f, g, o = gates.chunk(4, dim=1)  # (B, H) each
                new_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                if config.cell_clip is not None:
                    new_c = new_c.clamp(-config.cell_clip, config.cell_clip)
                new_h = (torch.sigmoid(o) * torch.tanh(new_c)) @ layer.projection_weight.t()
                if config.proj_clip is not None:
                    new_h = new_h.clamp(-config.proj_clip, config.proj_clip)  # (B, P)
                keep = mask[:, t].unsqueeze(1)  # (B, 1)
                h, c = torch.where(keep, new_h, h), torch.where(keep, new_c, c)
                output = new_h * keep
                outputs.append(output + layer_input[:, t] if index > 0 else output)
            layer_input = torch.stack(outputs, dim=1)  # (B, T, P)
        return layer_input

    def softmax(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean sampled-softmax loss, written out as ``tf.nn.sampled_softmax_loss`` states it."""
        softmax = self.model.softmax
        assert isinstance(softmax, SampledSoftmax)
        candidates, tries = softmax.sampler.sample_unique(softmax.num_samples)  # on the host
        candidates = candidates.to(hidden.device)  # every tensor of the step on the model's
        logits = torch.cat(
            [
                (hidden * softmax.weight[targets]).sum(-1, keepdim=True)
                + softmax.bias[targets].unsqueeze(1)
                - softmax.sampler.expected_count(targets, tries).log().float().unsqueeze(1),
                hidden @ softmax.weight[candidates].t()
                + softmax.bias[candidates]
                - softmax.sampler.expected_count(candidates, tries).log().float(),
            ],
            dim=1,
        )  # (N, 1+K)
        hits = F.pad(targets.unsqueeze(1) == candidates.unsqueeze(0), (1, 0))  # (N, 1+K)
        logits = logits.masked_fill(hits, torch.finfo(logits.dtype).min)
        return F.cross_entropy(logits, torch.zeros_like(targets))

    def training_loss(self, windows: Batch) -> torch.Tensor:
        losses = []
        for name, stack in (
            ("forward", self.model.forward_lstm),
            ("backward", self.model.backward_lstm),
        ):
            inputs = windows[f"{name}_inputs"]
            mask = (inputs != 0).any(dim=-1)  # (B, T)
            top = self.lstm(stack, self.char_cnn(inputs), mask)  # (B, T, P)
            losses.append(
                self.softmax(top.reshape(-1, top.shape[-1]), windows[f"{name}_targets"].reshape(-1))
            )
        return 0.5 * (losses[0] + losses[1])

    def forward(self, char_ids: torch.Tensor) -> list[torch.Tensor]:
        """Top ``[f; b]`` activations ``(B, T+2, 2P)`` as ``BiLM.forward`` returns them."""
        ids, mask, lengths = self.model.add_sentence_markers(char_ids.long())  # (B, T+2, W)
        embedded = self.char_cnn(ids) * mask.unsqueeze(-1)  # (B, T+2, P)
        reverse = reversal_index(lengths, ids.shape[1])  # (B, T+2)
        top_forward = self.lstm(self.model.forward_lstm, embedded, mask)
        top_backward = self.lstm(
            self.model.backward_lstm, gather_positions(embedded, reverse), mask
        )
        return [torch.cat([top_forward, gather_positions(top_backward, reverse)], dim=-1)]


# ----------------------------------------------------------------------------- timing


def median_seconds(
    slow: Callable[[], object], fast: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median wall times of ``repeats`` calls each after a warm-up, the two taking turns so that
    load from other work on the machine falls on both alike (:func:`harness.time_in_turn`)."""
    seconds = time_in_turn({"slow": slow, "fast": fast}, repeats)
    return seconds["slow"], seconds["fast"]


def backward_of(compute: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """Forward + backward of one component (the sum of its output as the loss)."""
    return lambda: compute().float().sum().backward()


def training_step(loss: Callable[[], torch.Tensor], model: BiLM) -> Callable[[], None]:
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()

    return step


def differences(
    model: BiLM, baseline: StraightforwardBiLM, windows: Batch, inference: torch.Tensor
) -> tuple[float, float]:
    """How far the candidate's top activations and training loss are from the baseline's."""
    with torch.no_grad():
        model.eval()
        activations = relative_error(model(inference).activations[-1], baseline(inference)[-1])
        model.train()
        torch.manual_seed(0)
        candidate_loss = model.training_loss(**windows)[0].loss
        torch.manual_seed(0)
        loss = relative_error(candidate_loss, baseline.training_loss(windows))
    return activations, loss


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got − expected| / (1 + |expected|), a NaN counted infinite: at most ``tol`` exactly
    where ``torch.testing.assert_close(got, expected, rtol=tol, atol=tol)`` passes."""
    error = (got - expected).abs() / (1 + expected.abs())
    return float(error.nan_to_num(nan=float("inf")).max())


def bench_preset(
    name: str, windows: Batch, inference: torch.Tensor, vocab_size: int, args: argparse.Namespace
) -> dict[str, float]:
    """Seconds per call, baseline and candidate, for the whole step and each component."""
    # dropout 0 in both models, so that their losses can be compared exactly
    config = model_preset(name).model_copy(update={"dropout": 0.0, "num_samples": args.num_samples})
    torch.manual_seed(0)
    model = BiLM(config, vocab_size)
    baseline = StraightforwardBiLM(model)
    activations, loss = differences(model, baseline, windows, inference)
    check_agreement({"top activations": activations}, 1e-4, f"{name}: the two biLMs")
    check_agreement({"training loss": loss}, 1e-5, f"{name}: the two biLMs")
    repeats = args.repeats
    both = torch.stack([windows["forward_inputs"], windows["backward_inputs"]])  # (2, B, T, W)
    mask = (windows["forward_inputs"] != 0).any(-1)  # (B, T)
    embedded = torch.randn(*mask.shape, config.lstm.projection_dim, requires_grad=True)
    hidden = torch.randn(mask.numel(), config.lstm.projection_dim, requires_grad=True)
    targets = windows["forward_targets"].reshape(-1)
    stacks = (model.forward_lstm, model.backward_lstm)
    model.train()
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "train": (
            training_step(lambda: baseline.training_loss(windows), model),
            training_step(lambda: model.training_loss(**windows)[0].loss, model),
        ),
        "train.char_cnn": (
            backward_of(lambda: baseline.char_cnn(both)),
            backward_of(lambda: model.token_encoder.encode_types(both)),
        ),
        "train.lstm": (
            backward_of(
                lambda: sum(baseline.lstm(stack, embedded, mask).sum() for stack in stacks)
            ),
            backward_of(lambda: sum(stack(embedded, mask)[0][-1].sum() for stack in stacks)),
        ),
        "train.softmax": (
            backward_of(lambda: 2 * baseline.softmax(hidden, targets)),
            backward_of(lambda: 2 * model.softmax(hidden, targets).mean()),
        ),
    }
    results = {}
    for case, (slow, fast) in cases.items():
        results[case] = median_seconds(slow, fast, repeats)
    model.eval()
    with torch.no_grad():
        ids, marker_mask, _ = model.add_sentence_markers(inference.long())
        results["inference"] = median_seconds(
            lambda: baseline(inference), lambda: model(inference), repeats
        )
        results["inference.char_cnn"] = median_seconds(
            lambda: baseline.char_cnn(ids), lambda: model.token_encoder.encode_types(ids), repeats
        )
    return {case: value for case, value in results.items()}


# ----------------------------------------------------------------------------- memory


def softmax_eval_peak_bytes(num_classes: int, dim: int, positions: int) -> tuple[int, int]:
    """Weights' bytes and the peak resident memory beyond them while scoring ``positions``."""
    softmax = SampledSoftmax(num_classes, dim, num_samples=1).eval()
    hidden = torch.randn(positions, dim)
    targets = torch.randint(0, num_classes, (positions,))
    weight_bytes = softmax.weight.nbytes + softmax.bias.nbytes
    page = 4096
    statm = Path("/proc/self/statm")
    read_rss = lambda: int(statm.read_text().split()[1]) * page  # noqa: E731
    before, peak, done = read_rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], read_rss())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with torch.no_grad():
        nll = softmax.nll(hidden, targets)
    done.set()
    sampler.join()
    assert torch.isfinite(nll).all()
    return weight_bytes, max(peak[0], read_rss()) - before


# ----------------------------------------------------------------------------- report


def format_table(results: dict[str, dict[str, tuple[float, float]]], tokens: int) -> str:
    lines = [
        f"{'preset':9} {'case':24} {'baseline s':>11} {'ours s':>9} {'ratio':>6} {'ours tok/s':>11}"
    ]
    for preset, cases in results.items():
        for case, (slow, fast) in cases.items():
            rate = f"{tokens / fast:11.0f}" if "." not in case else " " * 11
            lines.append(f"{preset:9} {case:24} {slow:11.3f} {fast:9.3f} {slow / fast:6.2f} {rate}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--presets", default="small,original")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up")
    parser.add_argument(
        "--num-samples",
        type=int,
        default=2048,
        help="sampled candidates (the original draws 8192 of 793k; of PTB's 10k, 2048)",
    )
    parser.add_argument("--softmax-vocab", type=int, default=793_471)
    parser.add_argument("--softmax-positions", type=int, default=256)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (1 on a machine shared with others)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    corpus = args.data_root / "ptb" / "ptb.train.txt"
    if not corpus.is_file():
        print(f"skipped: {corpus} not found (pass --data-root)")
        return 0
    torch.manual_seed(0)
    windows, inference, vocab_size = read_ptb(corpus, args.batch, args.window)
    tokens = args.batch * args.window
    results = {
        name: bench_preset(name, windows, inference, vocab_size, args)
        for name in args.presets.split(",")
    }
    weight_bytes, peak = softmax_eval_peak_bytes(args.softmax_vocab, 512, args.softmax_positions)

    summary: dict[str, object] = {
        "threads": torch.get_num_threads(),
        "vocab": vocab_size,
        "batch": [args.batch, args.window],
    }
    for preset, cases in results.items():
        for case, (slow, fast) in cases.items():
            summary[f"{preset}.{case}.ratio"] = round(slow / fast, 3)
        summary[f"{preset}.train.tokens_per_s"] = round(tokens / cases["train"][1], 1)
        summary[f"{preset}.inference.tokens_per_s"] = round(tokens / cases["inference"][1], 1)
    summary["softmax_eval_peak_gb_beyond_weights"] = round(peak / 1e9, 3)
    summary["softmax_weights_gb"] = round(weight_bytes / 1e9, 3)

    table = format_table(results, tokens)
    memory = (
        f"full-softmax evaluation, V={args.softmax_vocab}, P=512, N={args.softmax_positions}: "
        f"weights {weight_bytes / 1e9:.2f} GB, peak RSS beyond them {peak / 1e9:.3f} GB "
        f"(all logits at once: {args.softmax_positions * args.softmax_vocab * 4 / 1e9:.2f} GB)"
    )
    arguments = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python -m benchmarks.bench_bilm", *map(shlex.quote, arguments)])
    print(table, memory, sep="\n")
    args.results.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now()  # the file is bench_bilm-<date>.md: a rerun that day replaces it
    report = f"# bench_bilm {now:%Y-%m-%d %H:%M}\n\n    {command}\n\n"
    report += f"```\n{table}\n{memory}\n```\n\n{json.dumps(summary)}\n"
    (args.results / f"bench_bilm-{now:%Y-%m-%d}.md").write_text(report)
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
