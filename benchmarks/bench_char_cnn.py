"""Where a CPU step goes in the char CNN, and two speed-ups for it (the CPU speed work).

    python -m benchmarks.bench_char_cnn              # small and ptb-small, 1 and 2 threads
    python -m benchmarks.bench_char_cnn --presets small --threads 1 --repeats 3
    python -m benchmarks.bench_char_cnn --smoke      # tiny sizes, synthetic words (tested in CI)

On the distinct token types of one training batch of real text, forward and backward on the CPU:
the char CNN's share of the step and of its pieces, ``amax`` against ``max`` pooling, the
per-width convolutions against one padded one, and the highway in float32 against bf16, all timed
in turn against the model as of 2026-11-25. Last line: one JSON object (``ratio`` = geometric mean
of per-width / padded seconds); the method and results: benchmarks/results/bench_char_cnn-*.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_cpu_step import model_config
from benchmarks.bench_step_ops import Launches
from benchmarks.harness import check_agreement, print_summary, time_in_turn
from benchmarks.workload import synthetic_windows, worker_step
from elmo_core.config import ModelConfig, TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.model.char_cnn import (
    CharCNN,
    TokenTypes,
    pool_padded,
    pool_per_width,
    token_types,
    trim_tail,
)
from elmo_core.text.char_ids import tokens_to_ids
from elmo_core.training.step import TrainingStep

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "data" / "wikitext2" / "wiki.valid.tokens"
AGREE = 1e-4  # padded and max against per-width amax: float32 rounding, relative to the largest
Windows = tuple[dict[str, torch.Tensor], TokenTypes, np.ndarray]
Pool = Callable[[CharCNN, torch.Tensor, int], torch.Tensor]


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


def pool_amax(encoder: CharCNN, chars: torch.Tensor, used_width: int) -> torch.Tensor:
    """The per-width pooling as of 2026-11-25: ``amax``, whose backward compares the whole conv
    output with the max again."""
    return torch.cat([conv(chars).amax(dim=-1) for conv in encoder.convolutions], dim=-1)


def pooled(encoder: CharCNN, setting: Setting, pool: Pool) -> torch.Tensor:
    """The embedding, ``pool`` and the activation: the char CNN up to the highway, ``(U, F)``."""
    chars = encoder.char_embedding(setting.trimmed).transpose(1, 2)  # (U, E, W')
    return encoder.activation(pool(encoder, chars, setting.types.used_width))  # (U, F)


def as_before(encoder: CharCNN) -> CharCNN:
    """``encoder`` as the model was before: ``amax`` pooling, the highway in float32."""
    encoder.pool = pool_amax
    encoder.highway.cpu_bf16 = False
    return encoder


def relative_difference(expected: torch.Tensor, actual: torch.Tensor) -> float:
    """max |Δ| / max |expected|: one figure per tensor, defined where entries cross zero."""
    scale = expected.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    return float((actual.float() - expected).abs().max() / scale)


@dataclass
class Setting:
    """A model's char CNN (training mode) on one batch's types, and each piece's gradient."""

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
    encoder = CharCNN(config).train()
    windows, types, _ = batch
    char_ids = torch.stack([windows["forward_inputs"], windows["backward_inputs"]])
    trimmed = trim_tail(types.char_ids.long(), encoder.max_width, types.used_width)
    grad_output = torch.randn(*char_ids.shape[:-1], encoder.output_dim)  # (2, B, T, P)
    grad_projected = torch.zeros(trimmed.shape[0], encoder.output_dim).index_add_(
        0, types.inverse.reshape(-1), grad_output.reshape(-1, encoder.output_dim)
    )  # (U, P): the gather's backward
    chars = encoder.char_embedding(trimmed).transpose(1, 2)  # (U, E, W')
    convolved = [conv(chars) for conv in encoder.convolutions]  # [(U, n, W'−w+1)]
    for out in convolved:
        out.retain_grad()
    pool = torch.cat([encoder.activation(out.amax(dim=-1)) for out in convolved], dim=-1)
    pool.retain_grad()
    encoder.highway.cpu_bf16, cpu_bf16 = False, encoder.highway.cpu_bf16
    features = encoder.highway(pool)  # (U, F)
    encoder.highway.cpu_bf16 = cpu_bf16
    features.retain_grad()
    encoder.projection(features).backward(grad_projected)
    assert pool.grad is not None and features.grad is not None
    return Setting(
        encoder,
        char_ids,
        types,
        trimmed,
        grad_output,
        grad_projected,
        features.grad,
        pool.grad,
        [out.grad for out in convolved if out.grad is not None],
        pool.detach(),
        features.detach(),
    )


def runs(setting: Setting) -> dict[str, Callable[[], None]]:
    """Each timed piece: a forward and its backward, the parameters' gradients cleared first."""
    encoder = setting.encoder
    before = as_before(CharCNN(encoder.config).train())
    before.load_state_dict(encoder.state_dict())

    def backward(
        make: Callable[[], torch.Tensor], grad: torch.Tensor, module: torch.nn.Module = encoder
    ) -> Callable[[], None]:
        def run() -> None:
            module.zero_grad(set_to_none=True)
            make().backward(grad)

        return run

    def leaf(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone().requires_grad_()

    def convolutions() -> None:
        encoder.zero_grad(set_to_none=True)
        chars = encoder.char_embedding(setting.trimmed).transpose(1, 2)  # (U, E, W')
        outs = [conv(chars) for conv in encoder.convolutions]  # [(U, n, W'−w+1)]
        torch.autograd.backward(outs, setting.grad_convolved)

    def highway(cpu_bf16: bool) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            encoder.highway.cpu_bf16 = cpu_bf16
            return encoder.highway(leaf(setting.pooled))

        return make

    def encode(module: CharCNN) -> Callable[[], torch.Tensor]:
        return lambda: module.encode_types(setting.char_ids, setting.types)

    return {
        "char CNN before": backward(encode(before), setting.grad_output, before),
        "char CNN": backward(encode(encoder), setting.grad_output),
        "amax": backward(lambda: pooled(encoder, setting, pool_amax), setting.grad_pooled),
        "convolutions": convolutions,
        "per-width": backward(
            lambda: pooled(encoder, setting, pool_per_width), setting.grad_pooled
        ),
        "padded": backward(lambda: pooled(encoder, setting, pool_padded), setting.grad_pooled),
        "highway": backward(highway(False), setting.grad_features),
        "highway bf16": backward(highway(True), setting.grad_features),
        "projection": backward(
            lambda: encoder.projection(leaf(setting.features)), setting.grad_projected
        ),
    }


def pool_agreement(setting: Setting) -> dict[str, float]:
    """``max`` and padded pooling against ``amax``: the features' and the worst gradient's
    difference."""
    encoder = setting.encoder
    results = {}
    for name, pool in (("amax", pool_amax), ("max", pool_per_width), ("padded", pool_padded)):
        encoder.zero_grad(set_to_none=True)
        features = pooled(encoder, setting, pool)
        features.backward(setting.grad_pooled)
        grads = [p.grad.clone() for p in encoder.parameters() if p.grad is not None]
        results[name] = (features.detach(), grads)
    expected, expected_grads = results.pop("amax")
    assert len(expected_grads) == 1 + 2 * len(encoder.convolutions)
    differences = {}
    for name, (actual, actual_grads) in results.items():
        differences[f"{name}_feature_difference"] = relative_difference(expected, actual)
        differences[f"{name}_grad_difference"] = max(
            relative_difference(e, a) for e, a in zip(expected_grads, actual_grads, strict=True)
        )
    return differences


def bf16_difference(setting: Setting) -> dict[str, object]:
    """The char CNN with the highway in bf16 against float32: its output (max |Δ| and relative),
    and the worst gradient (every parameter's) with its name."""
    encoder = setting.encoder
    results = []
    for cpu_bf16 in (False, True):
        encoder.zero_grad(set_to_none=True)
        encoder.highway.cpu_bf16 = cpu_bf16
        output = encoder.encode_types(setting.char_ids, setting.types)  # (2, B, T, P)
        output.backward(setting.grad_output)
        grads = {name: p.grad for name, p in encoder.named_parameters() if p.grad is not None}
        results.append((output.detach(), grads))
    (expected, expected_grads), (actual, actual_grads) = results
    differences = {
        name: relative_difference(grad, actual_grads[name]) for name, grad in expected_grads.items()
    }
    worst = max(differences, key=lambda name: differences[name])
    return {
        "bf16_output_abs_difference": float((actual - expected).abs().max()),
        "bf16_output_difference": relative_difference(expected, actual),
        "bf16_grad_difference": differences[worst],
        "bf16_worst_grad": worst,
    }


def count_ops(setting: Setting) -> dict[str, int]:
    """aten ops (views included) of a forward and its backward: each pooling, the char CNN."""
    encoder = setting.encoder
    padded = CharCNN(encoder.config.model_copy(update={"conv_impl": "padded"})).train()

    def pool_run(pool: Pool) -> Callable[[], None]:
        return lambda: pooled(encoder, setting, pool).backward(setting.grad_pooled)

    def encode_run(module: CharCNN) -> Callable[[], None]:
        return lambda: module.encode_types(setting.char_ids, setting.types).backward(
            setting.grad_output
        )

    counted = {
        "amax": pool_run(pool_amax),
        "per-width": pool_run(pool_per_width),
        "padded": pool_run(pool_padded),
        "char CNN before": encode_run(as_before(CharCNN(encoder.config).train())),
        "char CNN": encode_run(encoder),
        "char CNN padded": encode_run(padded),
    }
    counts = {}
    for name, run in counted.items():
        encoder.zero_grad(set_to_none=True)
        with Launches() as launches:
            run()
        counts[name] = launches.aten
    return counts


def build_step(
    config: ModelConfig, batch: Windows, vocab: int, before: bool = False
) -> Callable[[], None]:
    """The whole CPU training step on ``batch``, as ``bench_cpu_step.py`` runs it; ``before``:
    with the char CNN as it was (:func:`as_before`)."""
    torch.manual_seed(0)
    windows, types, targets = batch
    rows, window = windows["forward_targets"].shape
    recipe = TrainConfig(batch_size=rows, unroll_steps=window, bf16=False)
    model = BiLM(config, vocab).train()
    if before:
        as_before(model.token_encoder)
    step = TrainingStep.build(model, recipe, "sparse")
    return worker_step(step, windows, types, targets)


def loss_difference(config: ModelConfig, batch: Windows, vocab: int, steps: int) -> float:
    """The largest relative difference of the loss over ``steps`` training steps (same seed,
    state carried), the highway in bf16 against float32."""
    windows, types, _ = batch
    rows, window = windows["forward_targets"].shape
    recipe = TrainConfig(batch_size=rows, unroll_steps=window, bf16=False)
    losses = []
    for cpu_bf16 in (False, True):
        torch.manual_seed(0)
        step = TrainingStep.build(
            BiLM(config.model_copy(update={"cpu_highway_bf16": cpu_bf16}), vocab).train(),
            recipe,
            "sparse",
        )
        state, run = None, []
        for _ in range(steps):
            result = step(
                windows["forward_inputs"],
                windows["forward_targets"],
                windows["backward_inputs"],
                windows["backward_targets"],
                state,
                types=types,
            )
            state = result.state
            run.append(float(result.output.loss.detach()))
        losses.append(np.array(run))
    return float(np.max(np.abs(losses[1] - losses[0]) / np.abs(losses[0])))


def load_batch(args: argparse.Namespace) -> tuple[Windows, str]:
    """The batch's windows, and where its words come from."""
    if args.text != "synthetic" and Path(args.text).is_file():
        return text_windows(Path(args.text), args.rows, args.window, args.vocab), args.text
    width = model_config(args.presets.split(",")[0]).char_cnn.max_chars_per_token
    cpu = torch.device("cpu")
    windows = synthetic_windows(args.rows, args.window, args.vocab, args.types, width, cpu)
    return windows, f"synthetic Zipf words ({args.types:,} types)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--presets", default="small,ptb-small", help="presets or configs/ names")
    parser.add_argument("--step-presets", default="small,ptb-small", help="whole step timed")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--threads", default="1,2", help="torch threads, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--loss-steps", type=int, default=5, help="steps of the bf16 loss check")
    parser.add_argument("--vocab", type=int, default=100_000, help="softmax words (the step)")
    parser.add_argument("--text", default=str(TEXT), help="tokenized text, or 'synthetic'")
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.presets, args.step_presets, args.rows, args.window = "tiny", "tiny", 4, 5
        args.threads, args.repeats, args.warmup, args.vocab = "1", 2, 1, 200
        args.text, args.types, args.loss_steps = "synthetic", 50, 2
    return args


def check(config: ModelConfig, setting: Setting, args: argparse.Namespace, batch: Windows) -> dict:
    """The agreement of ``max`` and padded pooling with ``amax`` (fails the run past
    :data:`AGREE`), the bf16 differences and the ops counts."""
    agreement = pool_agreement(setting)
    check_agreement(agreement, AGREE, "pooling and amax")
    return {
        "types": setting.trimmed.shape[0],
        "width": setting.trimmed.shape[1],
        **agreement,
        **bf16_difference(setting),
        "bf16_loss_difference": loss_difference(config, batch, args.vocab, args.loss_steps),
        **{f"ops_{name}": count for name, count in count_ops(setting).items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batch, source = load_batch(args)
    threads_before, load_before = torch.get_num_threads(), os.getloadavg()
    started = time.perf_counter()
    seconds: dict[tuple[str, int], dict[str, float]] = {}
    checks: dict[str, dict[str, object]] = {}
    for preset in args.presets.split(","):
        config = model_config(preset)
        setting = build_setting(config, batch)
        checks[preset] = check(config, setting, args, batch)
        timed = runs(setting)
        if preset in args.step_presets.split(","):
            timed["step before"] = build_step(config, batch, args.vocab, before=True)
            timed["step"] = build_step(config, batch, args.vocab)
        for threads in (int(value) for value in args.threads.split(",")):
            torch.set_num_threads(threads)
            seconds[preset, threads] = time_in_turn(timed, args.repeats, args.warmup)
    torch.set_num_threads(threads_before)
    load_after = os.getloadavg()
    print(
        f"char CNN on CPU, forward + backward, the types of {args.rows} × {args.window} positions "
        f"× 2 streams of {source}; median of {args.repeats} rounds after {args.warmup} warm-up, "
        f"runs in turn; {os.cpu_count()} CPUs, torch {torch.__version__}; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; {time.perf_counter() - started:.0f} s"
    )
    summary = report(args, seconds, checks)
    summary["loadavg_1min_before"] = round(load_before[0], 2)
    summary["loadavg_1min_after"] = round(load_after[0], 2)
    print_summary(summary)
    return 0


def report(
    args: argparse.Namespace,
    seconds: dict[tuple[str, int], dict[str, float]],
    checks: dict[str, dict[str, object]],
) -> dict[str, object]:
    """The table and the checks, printed; the summary's figures returned."""
    summary: dict[str, object] = {
        "benchmark": "char_cnn",
        "rows": args.rows,
        "window": args.window,
        "repeats": args.repeats,
    }
    print(
        f"{'preset':9} {'thr':>3} {'step was':>8} {'step s':>7} {'CNN was':>7} {'CNN s':>6} "
        f"{'share was':>9} {'share':>5}  {'conv':>4} {'max':>4} {'hw':>4} {'proj':>4}  "
        f"{'amax s':>6} {'per-width s':>11} {'padded s':>8} {'pw/pad':>6}  "
        f"{'hw f32 s':>8} {'bf16 s':>6} {'f32/bf16':>8}"
    )
    ratios = []
    for (preset, threads), time_of in seconds.items():
        setting = f"{preset}_t{threads}"
        cnn_before, cnn = time_of["char CNN before"], time_of["char CNN"]
        parts = {
            "convolutions": time_of["convolutions"],
            "max": time_of["amax"] - time_of["convolutions"],
            "highway": time_of["highway"],
            "projection": time_of["projection"],
        }
        ratios.append(time_of["per-width"] / time_of["padded"])
        step_before, step = time_of.get("step before"), time_of.get("step")
        summary |= {f"{setting}_{_key(name)}_s": round(value, 6) for name, value in time_of.items()}
        if step_before and step:
            summary[f"share_char_cnn_before_{setting}"] = round(cnn_before / step_before, 3)
            summary[f"share_char_cnn_{setting}"] = round(cnn / step, 3)
            summary[f"ratio_step_{setting}"] = round(step_before / step, 3)
        summary |= {
            f"share_{name}_{setting}": round(v / cnn_before, 3) for name, v in parts.items()
        }
        summary[f"ratio_max_{setting}"] = round(time_of["amax"] / time_of["per-width"], 3)
        summary[f"ratio_padded_{setting}"] = round(ratios[-1], 3)
        summary[f"ratio_bf16_{setting}"] = round(time_of["highway"] / time_of["highway bf16"], 3)
        print(
            f"{preset:9} {threads:3} {_seconds(step_before, 8)} {_seconds(step, 7)} "
            f"{cnn_before:7.3f} {cnn:6.3f} {_share(cnn_before, step_before, 9)} "
            f"{_share(cnn, step, 5)}  "
            + " ".join(f"{value / cnn_before:4.0%}" for value in parts.values())
            + f"  {time_of['amax']:6.3f} {time_of['per-width']:11.3f} "
            f"{time_of['padded']:8.3f} {ratios[-1]:5.2f}x  "
            f"{time_of['highway']:8.3f} {time_of['highway bf16']:6.3f} "
            f"{summary[f'ratio_bf16_{setting}']:7.2f}x"
        )
    for preset, check in checks.items():
        print(
            f"{preset}: " + ", ".join(f"{name} {_format(value)}" for name, value in check.items())
        )
        summary |= {
            f"{_key(name)}_{preset}": (round(value, 8) if isinstance(value, float) else value)
            for name, value in check.items()
        }
    summary["ratio"] = round(math.exp(statistics.fmean(map(math.log, ratios))), 3)
    return summary


def _seconds(value: float | None, width: int) -> str:
    return f"{value:{width}.3f}" if value else f"{'-':>{width}}"


def _share(part: float, whole: float | None, width: int) -> str:
    return f"{part / whole:{width}.0%}" if whole else f"{'-':>{width}}"


def _format(value: object) -> str:
    return f"{value:.1e}" if isinstance(value, float) else str(value)


def _key(name: str) -> str:
    """A run's or check's name as a JSON key: ``per-width`` → ``per_width``."""
    return name.replace(" ", "_").replace("-", "_")


if __name__ == "__main__":
    sys.exit(main())
