"""Where a CPU step goes in the char CNN, and two candidate speed-ups for it (issue 23).

    python benchmarks/bench_char_cnn.py              # small and original, 1 and 2 threads
    python benchmarks/bench_char_cnn.py --presets small --threads 1 --repeats 3
    python benchmarks/bench_char_cnn.py --smoke      # tiny sizes, synthetic words (tested in CI)

Inputs: the distinct token types of one training batch (``--rows`` × ``--window``, both streams)
of real text (``--text``, WikiText-2 valid from ``../shared/data`` by default; ``synthetic``, or
the file absent: ``gpu_bilm.py``'s Zipf words), trimmed as the model trims them; float32 on the
CPU, forward and backward, each piece given the gradient that reaches it in the real backward.
Per (preset, threads), all runs timed in turn (``bench_cpu_step.time_in_turn``), median of
``--repeats``:

- share: the whole ``TrainingStep`` (for ``--step-presets``) against the char CNN's
  ``encode_types``, and within it the convolutions (embedding and every Conv1d), the max over
  positions with the activation, the highway and the projection;
- padded: the per-width convolutions and their maxima against ONE convolution of all filters
  stacked (narrow filters zero-padded on the right, the ids right-padded with 0, whose embedding
  is zero, and positions past a filter's own last valid one masked to −inf before the max): the
  same pooled features and gradients (checked), and the aten ops of its forward + backward
  (about one kernel launch each on a GPU);
- bf16: the highway and the projection under ``torch.autocast("cpu", dtype=torch.bfloat16)``
  against float32, and the largest relative difference (max |Δ| / max |float32|) of the output
  and of every gradient.

Last line: one JSON object; ``ratio_padded_<setting>`` = per-width seconds / padded seconds,
``ratio_bf16_<setting>`` = float32 / bf16 seconds (highway + projection), ``ratio`` the geometric
mean of the padded ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from bench_cpu_step import time_in_turn  # noqa: E402
from bench_step_ops import Launches  # noqa: E402
from gpu_bilm import synthetic_windows, worker_step  # noqa: E402

from elmo_core.config import ModelConfig, TrainConfig  # noqa: E402
from elmo_core.model.bilm import BiLM  # noqa: E402
from elmo_core.model.char_cnn import CharCNN, TokenTypes, _trim_tail, token_types  # noqa: E402
from elmo_core.presets import model_preset  # noqa: E402
from elmo_core.text.char_ids import tokens_to_ids  # noqa: E402
from elmo_core.training.step import TrainingStep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "data" / "wikitext2" / "wiki.valid.tokens"
AGREE = 1e-4  # padded against per-width: float32 rounding, relative to the largest value
Windows = tuple[dict[str, torch.Tensor], TokenTypes, np.ndarray]


def text_windows(path: Path, rows: int, window: int, vocab: int) -> Windows:
    """Both streams as ``gpu_bilm.synthetic_windows`` makes them, from ``rows`` windows of real
    text each (the backward stream reversed); word ids are frequency ranks, those past
    ``vocab`` share its last id (an <UNK> stand-in)."""
    words = path.read_text(encoding="utf-8").split()
    ranked = [word for word, _ in Counter(words).most_common()]
    rank = {word: index for index, word in enumerate(ranked)}
    ids = np.array([rank[word] for word in words])  # (tokens,)
    table = tokens_to_ids(ranked)  # (V, W) int16
    starts = np.random.default_rng(0).integers(0, len(ids) - window - 1, (2, rows))
    windows, type_ids, targets = {}, [], []
    for stream, name in enumerate(("forward", "backward")):
        words_ids = np.stack([ids[start : start + window + 1] for start in starts[stream]])
        if name == "backward":
            words_ids = words_ids[:, ::-1]  # (B, T+1)
        type_ids.append(words_ids[:, :-1])  # (B, T)
        targets.append(np.minimum(words_ids[:, 1:], vocab - 1))  # (B, T)
        windows[f"{name}_inputs"] = torch.from_numpy(table[words_ids[:, :-1]].astype(np.int64))
        windows[f"{name}_targets"] = torch.from_numpy(targets[-1].copy())
    return windows, token_types(np.stack(type_ids), table), np.stack(targets)


def per_width_pool(encoder: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """``char_ids (N, W')`` → pooled features ``(N, F)``, one Conv1d per width (as the model)."""
    chars = encoder.char_embedding(char_ids).transpose(1, 2)  # (N, E, W')
    pooled = [encoder.activation(conv(chars).amax(dim=-1)) for conv in encoder.convolutions]
    return torch.cat(pooled, dim=-1)  # (N, F)


def padded_pool(encoder: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """``char_ids (N, W')`` → the same ``(N, F)`` by ONE convolution of every filter.

    A filter of width w zero-padded to the widest sees its own window plus columns it weighs by
    zero; the ids get ``widest − narrowest`` columns of 0 (a zero embedding) so that the narrowest
    filter keeps all its positions; a position past ``W' − w`` is not one of a filter's own and
    is masked before the max. The weight is built from the Conv1d's on every call, so their
    parameters and gradients stay where a checkpoint has them.
    """
    convolutions = [cast(nn.Conv1d, conv) for conv in encoder.convolutions]
    widths = [conv.kernel_size[0] for conv in convolutions]
    widest, narrowest = max(widths), min(widths)
    weight = torch.cat(  # (F, E, widest)
        [
            F.pad(conv.weight, (0, widest - width))
            for conv, width in zip(convolutions, widths, strict=True)
        ]
    )
    bias = torch.cat([cast(torch.Tensor, conv.bias) for conv in convolutions])  # (F,)
    chars = encoder.char_embedding(F.pad(char_ids, (0, widest - narrowest)))  # (N, W'+pad, E)
    out = F.conv1d(chars.transpose(1, 2), weight, bias)  # (N, F, W' − narrowest + 1)
    own_last = np.repeat(  # (F,) each filter's last valid position
        [char_ids.shape[1] - width for width in widths],
        [conv.out_channels for conv in convolutions],
    )
    beyond = torch.from_numpy(np.arange(out.shape[-1]) > own_last[:, None])  # (F, W'−narrowest+1)
    masked = out.masked_fill(beyond.to(out.device), float("-inf"))  # (N, F, W'−narrowest+1)
    return encoder.activation(masked.amax(dim=-1))  # (N, F)


def relative_difference(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """max |Δ| / max |expected|: one figure per tensor, defined where entries cross zero."""
    scale = expected.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    return float((actual.float() - expected).abs().max() / scale)


@dataclass
class Setting:
    """A model's char CNN on one batch's types, and the gradient each piece receives."""

    encoder: CharCNN
    char_ids: torch.Tensor  # (2, B, T, W)
    types: TokenTypes
    trimmed: torch.Tensor  # (U, W')
    grad_output: torch.Tensor  # (2, B, T, P) of encode_types
    grad_projected: torch.Tensor  # (U, P) what reaches the projection's output
    grad_features: torch.Tensor  # (U, F) what reaches the highway's output
    grad_pooled: torch.Tensor  # (U, F) what reaches the pooled features
    grad_convolved: list[torch.Tensor]  # [(U, n, W'−w+1)] what reaches each Conv1d's output
    pooled: torch.Tensor  # (U, F) the highway's input
    features: torch.Tensor  # (U, F) the projection's input


def build_setting(config: ModelConfig, batch: Windows) -> Setting:
    """The model's char CNN (seed 0) and one float32 forward + backward through its pieces, kept
    so that each piece is timed on the inputs and gradients it sees in the whole."""
    torch.manual_seed(0)
    encoder = CharCNN(config)
    windows, types, _ = batch
    char_ids = torch.stack([windows["forward_inputs"], windows["backward_inputs"]])
    trimmed = _trim_tail(types.char_ids.long(), encoder.max_width, types.used_width)
    grad_output = torch.randn(*char_ids.shape[:-1], encoder.output_dim)  # (2, B, T, P)
    grad_projected = torch.zeros(trimmed.shape[0], encoder.output_dim).index_add_(
        0, types.inverse.reshape(-1), grad_output.reshape(-1, encoder.output_dim)
    )  # (U, P): the gather's backward
    chars = encoder.char_embedding(trimmed).transpose(1, 2)  # (U, E, W')
    convolved = [conv(chars) for conv in encoder.convolutions]  # [(U, n, W'−w+1)]
    for out in convolved:
        out.retain_grad()
    pooled = torch.cat([encoder.activation(out.amax(dim=-1)) for out in convolved], dim=-1)
    pooled.retain_grad()
    features = encoder.highway(pooled)  # (U, F)
    features.retain_grad()
    encoder.projection(features).backward(grad_projected)
    assert pooled.grad is not None and features.grad is not None
    return Setting(
        encoder,
        char_ids,
        types,
        trimmed,
        grad_output,
        grad_projected,
        features.grad,
        pooled.grad,
        [out.grad for out in convolved if out.grad is not None],
        pooled.detach(),
        features.detach(),
    )


def runs(setting: Setting) -> dict[str, Callable[[], None]]:
    """Each timed piece: a forward and its backward, the parameters' gradients cleared first."""
    encoder = setting.encoder

    def backward(make: Callable[[], torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            encoder.zero_grad(set_to_none=True)
            make().backward(grad)

        return run

    def leaf(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone().requires_grad_()

    def convolutions() -> None:
        encoder.zero_grad(set_to_none=True)
        chars = encoder.char_embedding(setting.trimmed).transpose(1, 2)  # (U, E, W')
        outs = [conv(chars) for conv in encoder.convolutions]  # [(U, n, W'−w+1)]
        torch.autograd.backward(outs, setting.grad_convolved)

    def in_bf16(module: torch.nn.Module, inputs: torch.Tensor) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return module(leaf(inputs)).float()

        return make

    return {
        "char CNN": backward(
            lambda: encoder.encode_types(setting.char_ids, setting.types), setting.grad_output
        ),
        "per-width": backward(
            lambda: per_width_pool(encoder, setting.trimmed), setting.grad_pooled
        ),
        "convolutions": convolutions,
        "padded": backward(lambda: padded_pool(encoder, setting.trimmed), setting.grad_pooled),
        "highway": backward(lambda: encoder.highway(leaf(setting.pooled)), setting.grad_features),
        "projection": backward(
            lambda: encoder.projection(leaf(setting.features)), setting.grad_projected
        ),
        "highway bf16": backward(in_bf16(encoder.highway, setting.pooled), setting.grad_features),
        "projection bf16": backward(
            in_bf16(encoder.projection, setting.features), setting.grad_projected
        ),
    }


def pool_agreement(setting: Setting) -> tuple[float, float]:
    """Padded against per-width: the pooled features' and the worst gradient's difference."""
    encoder = setting.encoder
    results = []
    for pool in (per_width_pool, padded_pool):
        encoder.zero_grad(set_to_none=True)
        pooled = pool(encoder, setting.trimmed)
        pooled.backward(setting.grad_pooled)
        grads = [p.grad.clone() for p in encoder.parameters() if p.grad is not None]
        results.append((pooled.detach(), grads))
    (expected, expected_grads), (actual, actual_grads) = results
    assert len(expected_grads) == len(actual_grads) == 1 + 2 * len(encoder.convolutions)
    grad_difference = max(
        relative_difference(e, a) for e, a in zip(expected_grads, actual_grads, strict=True)
    )
    return relative_difference(expected, actual), grad_difference


def bf16_difference(setting: Setting) -> tuple[float, float, str]:
    """Highway then projection in bf16 against float32: output, and the worst gradient (input's
    and every parameter's) with its name."""
    encoder = setting.encoder
    modules = {"highway": encoder.highway, "projection": encoder.projection}
    results = []
    for enabled in (False, True):
        encoder.zero_grad(set_to_none=True)
        inputs = setting.pooled.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            output = encoder.projection(encoder.highway(inputs)).float()  # (U, P)
        output.backward(setting.grad_projected)
        named = [("input", inputs)] + [
            (f"{prefix}.{name}", parameter)
            for prefix, module in modules.items()
            for name, parameter in module.named_parameters()
        ]
        grads = {name: tensor.grad for name, tensor in named if tensor.grad is not None}
        results.append((output.detach(), grads))
    (expected, expected_grads), (actual, actual_grads) = results
    differences = {
        name: relative_difference(grad, actual_grads[name]) for name, grad in expected_grads.items()
    }
    worst = max(differences, key=lambda name: differences[name])
    return relative_difference(expected, actual), differences[worst], worst


def count_ops(setting: Setting) -> dict[str, int]:
    """aten ops (views included) of a forward and its backward: each pooling, the char CNN."""
    encoder = setting.encoder
    counted = {
        "per-width": lambda: per_width_pool(encoder, setting.trimmed).backward(setting.grad_pooled),
        "padded": lambda: padded_pool(encoder, setting.trimmed).backward(setting.grad_pooled),
        "char CNN": lambda: encoder.encode_types(setting.char_ids, setting.types).backward(
            setting.grad_output
        ),
    }
    counts = {}
    for name, run in counted.items():
        encoder.zero_grad(set_to_none=True)
        with Launches() as launches:
            run()
        counts[name] = launches.aten
    return counts


def build_step(config: ModelConfig, batch: Windows, vocab: int) -> Callable[[], None]:
    """The whole CPU training step on ``batch``, as ``bench_cpu_step.py`` runs it."""
    torch.manual_seed(0)
    windows, types, targets = batch
    rows, window = windows["forward_targets"].shape
    recipe = TrainConfig(batch_size=rows, unroll_steps=window, bf16=False)
    step = TrainingStep.build(BiLM(config, vocab).train(), recipe, "sparse")
    return worker_step(step, windows, types, targets)


def load_batch(args: argparse.Namespace) -> tuple[Windows, str]:
    """The batch's windows, and where its words come from."""
    if args.text != "synthetic" and Path(args.text).is_file():
        return text_windows(Path(args.text), args.rows, args.window, args.vocab), args.text
    width = model_preset(args.presets.split(",")[0]).char_cnn.max_chars_per_token
    cpu = torch.device("cpu")
    windows = synthetic_windows(args.rows, args.window, args.vocab, args.types, width, cpu)
    return windows, f"synthetic Zipf words ({args.types:,} types)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--presets", default="small,original")
    parser.add_argument("--step-presets", default="small", help="where the whole step is timed")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--threads", default="1,2", help="torch threads, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=100_000, help="softmax words (the step)")
    parser.add_argument("--text", default=str(TEXT), help="tokenized text, or 'synthetic'")
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.presets, args.step_presets, args.rows, args.window = "tiny", "tiny", 4, 5
        args.threads, args.repeats, args.warmup, args.vocab = "1", 2, 1, 200
        args.text, args.types = "synthetic", 50
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch, source = load_batch(args)
    threads_before, load_before = torch.get_num_threads(), os.getloadavg()
    started = time.perf_counter()
    seconds: dict[tuple[str, int], dict[str, float]] = {}
    checks: dict[str, dict[str, object]] = {}
    for preset in args.presets.split(","):
        config = model_preset(preset)
        setting = build_setting(config, batch)
        feature_difference, grad_difference = pool_agreement(setting)
        if max(feature_difference, grad_difference) > AGREE:
            raise SystemExit(
                f"{preset}: padded and per-width disagree (features {feature_difference:.1e}, "
                f"gradients {grad_difference:.1e})"
            )
        output_difference, bf16_grad, worst = bf16_difference(setting)
        checks[preset] = {
            "types": setting.trimmed.shape[0],
            "width": setting.trimmed.shape[1],
            "padded_feature_difference": feature_difference,
            "padded_grad_difference": grad_difference,
            "bf16_output_difference": output_difference,
            "bf16_grad_difference": bf16_grad,
            "bf16_worst_grad": worst,
            **{f"ops_{name}": count for name, count in count_ops(setting).items()},
        }
        timed = runs(setting)
        if preset in args.step_presets.split(","):
            timed["step"] = build_step(config, batch, args.vocab)
        for threads in (int(value) for value in args.threads.split(",")):
            torch.set_num_threads(threads)
            seconds[preset, threads] = time_in_turn(timed, args.repeats, args.warmup)
    torch.set_num_threads(threads_before)
    load_after = os.getloadavg()
    print(
        f"char CNN on CPU (float32 unless bf16), forward + backward, the types of {args.rows} × "
        f"{args.window} positions × 2 streams of {source}; median of {args.repeats} rounds after "
        f"{args.warmup} warm-up, runs in turn; {os.cpu_count()} CPUs, torch {torch.__version__}; "
        f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; {time.perf_counter() - started:.0f} s"
    )
    summary = report(args, seconds, checks)
    summary["loadavg_1min_before"] = round(load_before[0], 2)
    summary["loadavg_1min_after"] = round(load_after[0], 2)
    print(json.dumps(summary))
    return 0


def report(
    args: argparse.Namespace,
    seconds: dict[tuple[str, int], dict[str, float]],
    checks: dict[str, dict[str, object]],
) -> dict[str, object]:
    """The two tables and the checks, printed; the summary's figures returned."""
    summary: dict[str, object] = {
        "benchmark": "char_cnn",
        "rows": args.rows,
        "window": args.window,
        "repeats": args.repeats,
    }
    print(
        f"{'preset':9} {'threads':>7} {'step s':>7} {'CNN s':>7} {'share':>6} "
        f"{'conv':>5} {'max':>5} {'highway':>7} {'proj':>5}   "
        f"{'per-width s':>11} {'padded s':>8} {'pw/pad':>7}   "
        f"{'hw+proj s':>9} {'bf16 s':>7} {'f32/bf16':>8}"
    )
    ratios = []
    for (preset, threads), time_of in seconds.items():
        setting = f"{preset}_t{threads}"
        cnn = time_of["char CNN"]
        parts = {
            "convolutions": time_of["convolutions"],
            "max": time_of["per-width"] - time_of["convolutions"],
            "highway": time_of["highway"],
            "projection": time_of["projection"],
        }
        dense = time_of["highway"] + time_of["projection"]
        dense_bf16 = time_of["highway bf16"] + time_of["projection bf16"]
        ratios.append(time_of["per-width"] / time_of["padded"])
        step = time_of.get("step")
        print(
            f"{preset:9} {threads:7} {f'{step:.3f}' if step else '-':>7} {cnn:7.3f} "
            f"{f'{cnn / step:.0%}' if step else '-':>6} "
            + " ".join(
                f"{parts[name] / cnn:{len(label)}.0%}"
                for name, label in zip(parts, ("conv.", "max..", "highway", "proj."), strict=True)
            )
            + f"   {time_of['per-width']:11.3f} {time_of['padded']:8.3f} {ratios[-1]:6.3f}x"
            + f"   {dense:9.3f} {dense_bf16:7.3f} {dense / dense_bf16:7.2f}x"
        )
        summary |= {f"{setting}_{_key(name)}_s": round(value, 6) for name, value in time_of.items()}
        if step:
            summary[f"share_char_cnn_{setting}"] = round(cnn / step, 3)
        summary |= {f"share_{name}_{setting}": round(v / cnn, 3) for name, v in parts.items()}
        summary[f"ratio_padded_{setting}"] = round(ratios[-1], 3)
        summary[f"ratio_bf16_{setting}"] = round(dense / dense_bf16, 3)
    for preset, check in checks.items():
        print(
            f"{preset}: {check['types']:,} types, W' {check['width']}; padded against per-width "
            f"features {check['padded_feature_difference']:.1e}, gradients "
            f"{check['padded_grad_difference']:.1e}; aten ops forward + backward per-width "
            f"{check['ops_per-width']}, padded {check['ops_padded']} (whole char CNN "
            f"{check['ops_char CNN']}); bf16 against float32 output "
            f"{check['bf16_output_difference']:.1e}, gradients {check['bf16_grad_difference']:.1e}"
            f" ({check['bf16_worst_grad']})"
        )
        summary |= {
            f"{_key(name)}_{preset}": (round(value, 8) if isinstance(value, float) else value)
            for name, value in check.items()
        }
    summary["ratio"] = round(math.exp(statistics.fmean(map(math.log, ratios))), 3)
    return summary


def _key(name: str) -> str:
    """A run's or check's name as a JSON key: ``per-width`` → ``per_width``."""
    return name.replace(" ", "_").replace("-", "_")


if __name__ == "__main__":
    sys.exit(main())
