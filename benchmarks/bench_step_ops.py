"""Launches per training step: the ops one whole biLM training step dispatches.

    python -m benchmarks.bench_step_ops                      # original, 128 and 1024 rows × 20
    python -m benchmarks.bench_step_ops --rows 128 --launch-us 5 --efficiency 0.5
    python -m benchmarks.bench_step_ops --smoke              # tiny sizes (tested in CI)

Counts every op a :class:`elmo_core.training.step.TrainingStep` call dispatches, with a
``TorchDispatchMode`` on the meta device (no arithmetic, CUDA's device rules), a custom op as one
launch and views apart; then a PREDICTED H100 positions/s (a model, not a measurement). Last line:
one JSON object; ``ratio_<rows>`` = reference (directions apart) launches over fused batched
launches. Method and results: benchmarks/results/bench_step_ops-2026-11-25.md and -2026-11-26.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.harness import print_summary
from benchmarks.workload import synthetic_windows, training_flops_per_position, worker_step
from elmo_core.config import ModelConfig, TrainConfig
from elmo_core.model.bilm import BiLM
from elmo_core.presets import model_preset
from elmo_core.training import step as step_module
from elmo_core.training.step import TrainingStep

VARIANTS = {  # name: (lstm_impl, batch_directions)
    "reference_apart": ("reference", False),
    "reference_batched": ("reference", True),
    "fused_batched": ("fused", True),
    "fused_apart": ("fused", False),
}
GOAL_LAUNCHES = 600  # per step: the launch budget of the fused step
GOAL_POSITIONS_PER_S = 250_000  # one H100: the GPU training goal
UNCOUNTED_NAMESPACES = ("profiler",)  # record_function markers: no kernel
PHASES = ("forward", "backward", "clip", "optimizer")  # of a step, in order


class _Inside(TorchDispatchMode):
    """Counts the kernels (ops less views) a custom op's own implementation dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.namespace not in UNCOUNTED_NAMESPACES and not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


@dataclass
class Launches(TorchDispatchMode):
    """Counts ops as launches: each aten op that is not a view one, each custom op one (its
    inside ops apart)."""

    aten: int = 0
    views: int = 0  # aten views among them: metadata only, no kernel on a GPU
    custom: dict[str, int] = field(default_factory=dict)
    inside: _Inside = field(default_factory=_Inside)
    phase: str = PHASES[0]  # set by :func:`_phases` as the step goes
    by_phase: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def ops(self) -> int:
        """Everything dispatched, views included."""
        return self.aten + sum(self.custom.values())

    @property
    def total(self) -> int:
        """The launches: the ops less the views."""
        return self.ops - self.views

    @property
    def flattened(self) -> int:
        """The launches with each custom op replaced by the kernels its implementation runs."""
        return self.aten - self.views + self.inside.count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func.namespace in UNCOUNTED_NAMESPACES:
            return func(*args, **kwargs)
        self.by_phase[self.phase] += not (func.namespace == "aten" and func.is_view)
        if func.namespace == "aten":
            self.aten += 1
            self.views += bool(func.is_view)
            return func(*args, **kwargs)
        name = func.name()
        self.custom[name] = self.custom.get(name, 0) + 1
        opdef = OPDEFS.get(name)
        if opdef is None:  # not a torch.library custom op: nothing inside to count
            return func(*args, **kwargs)
        # The implementation itself (on meta the dispatcher would run only its fake), counted.
        on_meta = any(isinstance(a, torch.Tensor) and a.is_meta for a in args)
        with _no_autocast_on_meta(on_meta), self.inside:
            return opdef._init_fn(*args, **kwargs)


@contextlib.contextmanager
def _no_autocast_on_meta(on_meta: bool) -> Iterator[None]:
    """``torch.autocast`` as a no-op context while a custom op's implementation runs on meta
    tensors: autocast has no meta device (it raises), and entering it dispatches no op."""
    if not on_meta:
        yield
        return
    with mock.patch.object(torch, "autocast", lambda *_, **__: contextlib.nullcontext()):
        yield


def count_step(
    preset: str, variant: str, rows: int, window: int, vocab: int, types: int, device: str
) -> Launches:
    """One steady-state training step's launches (after a warm-up step)."""
    impl, batch_directions = VARIANTS[variant]
    config = model_preset(preset).model_copy(
        update={"lstm_impl": impl, "batch_directions": batch_directions}
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = BiLM(config, vocab).train()
    windows, token_types, targets = synthetic_windows(
        rows, window, vocab, types, config.char_cnn.max_chars_per_token, torch.device(device)
    )
    recipe = TrainConfig(batch_size=rows, unroll_steps=window, bf16=False)
    # The meta device has no sparse kernels: there the softmax's gradient is dense.
    step = TrainingStep.build(model, recipe, "dense" if device == "meta" else "sparse")
    run: Callable[[], None] = worker_step(step, windows, token_types, targets)
    run()  # warm-up: the carried state, the optimiser's state
    with Launches() as launches, _phases(step, launches):
        run()
    return launches


@contextlib.contextmanager
def _phases(step: TrainingStep, launches: Launches) -> Iterator[None]:
    """Moves ``launches`` to each phase as ``step`` enters it: the backward (the exchange follows
    it), the clip, the optimiser."""

    def entering(phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            launches.phase = phase
            return call(*args, **kwargs)

        return wrapped

    with (
        mock.patch.object(torch.Tensor, "backward", entering("backward", torch.Tensor.backward)),
        mock.patch.object(
            step_module, "clip_global_norm", entering("clip", step_module.clip_global_norm)
        ),
        mock.patch.object(step.optimizer, "step", entering("optimizer", step.optimizer.step)),
    ):
        yield


def predicted_positions_per_s(
    launches: int, flops_per_position: float, positions: int, args: Any
) -> tuple[float, str]:
    """Positions/s on the model's H100, and what bounds it (launches or FLOPs)."""
    launch_s = launches * args.launch_us * 1e-6
    compute_s = flops_per_position * positions / (args.peak_tflops * 1e12 * args.efficiency)
    return positions / max(launch_s, compute_s), "launch" if launch_s > compute_s else "FLOP"


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--rows", default="128,1024", help="rows per step, comma-separated")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=793_471)
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--device", default="meta", help="meta: no arithmetic (default)")
    parser.add_argument("--launch-us", type=float, default=5.0, help="host µs per launch")
    parser.add_argument("--peak-tflops", type=float, default=800.0, help="H100 bf16 dense")
    parser.add_argument("--efficiency", type=float, default=0.5, help="of the peak reached")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.rows, args.window, args.vocab, args.types = "tiny", "4,8", 5, 200, 50
    return args


def print_header(args: argparse.Namespace, config: ModelConfig, flops: float) -> dict[str, object]:
    """The run's settings and the model, printed, and the summary's first keys."""
    load = os.getloadavg()
    print(
        f"launches per training step, preset {args.preset}, vocab {args.vocab:,}, "
        f"K = {config.num_samples:,}, window {args.window}, device {args.device}, "
        f"torch {torch.__version__}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"model: a launch = an aten op or a custom op; PREDICTED H100 step = max(launches × "
        f"{args.launch_us:g} µs, FLOPs / ({args.peak_tflops:g} TFLOP/s × {args.efficiency:g})); "
        f"{flops / 1e9:.3f} GFLOP/position"
    )
    print(
        f"{'variant':18} {'rows':>5} {'ops':>6} {'views':>6} {'launches':>9} {'custom':>7} "
        f"{'inside':>7} "
        f"{'flattened':>10} {'≤600':>5} {'pred. pos/s':>12} {'bound':>6} {'≥250k':>6} "
        f"{'pred. flat':>11}"
    )
    return {
        "benchmark": "step_ops",
        "preset": args.preset,
        "vocab": args.vocab,
        "num_samples": config.num_samples,
        "window": args.window,
        "device": args.device,
        "launch_us": args.launch_us,
        "peak_tflops": args.peak_tflops,
        "efficiency": args.efficiency,
        "gflop_per_position": round(flops / 1e9, 4),
        "loadavg_1min": round(load[0], 2),
    }


def report_count(
    args: argparse.Namespace, variant: str, rows: int, launches: Launches, flops: float
) -> dict[str, object]:
    """One variant's launches at ``rows`` and the step they predict: a printed row, and its
    summary keys."""
    positions = rows * args.window
    rate, bound = predicted_positions_per_s(launches.total, flops, positions, args)
    flat_rate, _ = predicted_positions_per_s(launches.flattened, flops, positions, args)
    custom = sum(launches.custom.values())
    print(
        f"{variant:18} {rows:5} {launches.ops:6,} {launches.views:6,} {launches.total:9,} "
        f"{custom:7} "
        f"{launches.inside.count:7,} {launches.flattened:10,} "
        f"{'yes' if launches.total <= GOAL_LAUNCHES else 'no':>5} {rate:12,.0f} {bound:>6} "
        f"{'yes' if rate >= GOAL_POSITIONS_PER_S else 'no':>6} {flat_rate:11,.0f}"
    )
    key = f"{variant}_{rows}"
    return {
        f"ops_{key}": launches.ops,
        f"launches_{key}": launches.total,
        f"views_{key}": launches.views,
        f"custom_ops_{key}": custom,
        f"inside_{key}": launches.inside.count,
        f"flattened_{key}": launches.flattened,
        **{f"{phase}_{key}": count for phase, count in launches.by_phase.items()},
        f"predicted_positions_per_s_{key}": round(rate),
        f"predicted_flattened_positions_per_s_{key}": round(flat_rate),
        f"predicted_reaches_goal_{key}": rate >= GOAL_POSITIONS_PER_S,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    rows_list = [int(value) for value in args.rows.split(",") if value]
    config = model_preset(args.preset)
    flops = training_flops_per_position(config)
    counts = {
        (variant, rows): count_step(
            args.preset, variant, rows, args.window, args.vocab, args.types, args.device
        )
        for rows in rows_list
        for variant in VARIANTS
    }
    summary = print_header(args, config, flops)
    for (variant, rows), launches in counts.items():
        summary |= report_count(args, variant, rows, launches, flops)
    print(f"launches by phase: {'variant':18} {'rows':>5} " + " ".join(f"{p:>9}" for p in PHASES))
    for (variant, rows), launches in counts.items():
        phases = " ".join(f"{launches.by_phase[p]:9,}" for p in PHASES)
        print(f"launches by phase: {variant:18} {rows:5} {phases}")
    for rows in rows_list:
        fused = counts["fused_batched", rows].total
        summary[f"ratio_{rows}"] = round(counts["reference_apart", rows].total / fused, 2)
        summary[f"ratio_batched_{rows}"] = round(counts["reference_batched", rows].total / fused, 2)
        summary[f"fused_meets_launch_goal_{rows}"] = fused <= GOAL_LAUNCHES
    print(
        "compiled: not countable this way (Inductor's kernels launch below the dispatcher); "
        f"goal: ≤ {GOAL_LAUNCHES} launches per step, {GOAL_POSITIONS_PER_S:,} positions/s"
    )
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
