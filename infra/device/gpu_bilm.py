"""biLM training throughput and model FLOP utilisation on one accelerator (an H200 in mind).

One process, only ``elmo_core`` and ``torch``: the ``original`` model on synthetic Zipf words
(``benchmarks/workload.py``), timing :class:`elmo_core.training.step.TrainingStep` (the step a Ray
Train worker runs) next to ``benchmarks/bench_bilm.py``'s straightforward model. ``--sweep`` times
more rows, ``--profile`` says where a step's time goes, ``--inference`` times the frozen biLM.
Results: benchmarks/results/gpu_*.md.

    python -m infra.device.gpu_bilm                # original, 128 × 20, on CUDA
    python -m infra.device.gpu_bilm --only sweep --lstm-impl graphed --batch-directions \
        --sweep 256,512,1024
    python -m infra.device.gpu_bilm --smoke        # tiny sizes, any device (tested in CI)
    python -m infra.device.gpu_bilm --smoke --device meta  # CUDA's device rules on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.autograd import DeviceType

from benchmarks.bench_bilm import StraightforwardBiLM
from benchmarks.harness import print_summary, seconds_per_call
from benchmarks.workload import (
    found_ahead,
    synthetic_windows,
    training_flops_per_position,
    worker_step,
)
from elmo_core.config import ModelConfig, TrainConfig
from elmo_core.model import softmax as softmax_module
from elmo_core.model.bilm import BiLM
from elmo_core.model.char_cnn import TokenTypes
from elmo_core.model.lstm import VARIANTS
from elmo_core.model.sampler import SampledCandidates
from elmo_core.model.softmax import SampledSoftmax
from elmo_core.presets import model_preset
from elmo_core.training.gradient_exchange import ExchangeMode
from elmo_core.training.step import TrainingStep

STEPS, WARMUP = 10, 3  # timed steps, and the untimed ones before them (a captured step: its
# two eager warm-ups and its capture)


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """What makes the host wait for ``device``'s queued work before a clock is read."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def matmul_flops_per_second(device: torch.device, size: int, dtype: torch.dtype) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return 2 * size**3 / seconds_per_call(lambda: a @ b, 10, 3, synchronizer(device))


def replayed(name: str, step: TrainingStep) -> dict[str, object]:
    """A captured step's graphs, its replays and the shapes it ran eagerly (a failed capture),
    for the summary: a figure of ``name`` is the replays' only if they are the timed calls."""
    if step.graphs is None:
        return {}
    graphs = step.graphs
    return {
        f"{name}_graphs": len(graphs.graphs),
        f"{name}_replays": graphs.replays,
        f"{name}_uncaptured_shapes": len(graphs.eager),
    }


def straightforward_step(
    model: BiLM, loss: Callable[[], torch.Tensor], bf16: bool
) -> Callable[[], None]:
    """The baseline's step: dense gradients, ``clip_grad_norm_`` and a dense Adagrad."""
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.2, initial_accumulator_value=1.0)
    device_type = next(model.parameters()).device.type

    def step() -> None:
        autocast = (
            torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        )
        with autocast:
            value = loss()
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # the next step, ours or not, starts clean

    return step


KERNEL_KINDS = (  # (kind, name pattern) in the order a kernel is classified
    ("GEMM", re.compile(r"gemm|cutlass|xmma|sm\d+_|cublas|Kernel2", re.IGNORECASE)),
    ("Triton", re.compile(r"^triton_|^_\w+_kernel$")),  # Inductor's, and the fused layer's own
    ("copy", re.compile(r"memcpy|memset|copy|nchwToNhwc|nhwcToNchw", re.IGNORECASE)),
    ("convolution", re.compile(r"conv|cudnn", re.IGNORECASE)),
    ("reduction", re.compile(r"reduce|softmax|norm", re.IGNORECASE)),
    ("pointwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|index", re.IGNORECASE)),
)
TOP_KERNELS = 25
TOP_HOST_OPS = 15
TOP_DEVICE_OPS = 15
LAUNCHES = re.compile(r"^cu(da)?LaunchKernel")
SYNCS = re.compile(r"^cuda(Stream|Device|Event)Synchronize$")  # a host that waits for the GPU


def where_the_time_goes(
    run: Callable[[], object], steps: int, warmup: int = WARMUP
) -> dict[str, object]:
    """Per step: device milliseconds by kernel kind, the GPU's idle gaps between kernels, kernel
    launches and host syncs, the kernels that take longest, the ops that launched them
    (:func:`device_ops`), and the host's side (:func:`host_ops`): where the GPU idles, the host is
    what binds. ``warmup`` steps run first, unrecorded: a captured step's eager warm-ups and its
    capture among the recorded steps would count their launches and syncs as a replay's."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(warmup):
        run()
    with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
        for _ in range(steps):
            run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    summary: dict[str, object] = {
        **kernel_timeline(profile, steps),
        **kernel_kinds(profile, steps),
        **host_ops(profile, steps),
        **device_ops(profile, steps),
    }
    summary["top kernels"] = [
        [event.key[:80], round(event.self_device_time_total / 1e3 / steps, 3), event.count / steps]
        for event in sorted(
            filter(on_device, profile.key_averages()), key=lambda e: -e.self_device_time_total
        )[:TOP_KERNELS]
    ]
    return summary


def kernel_timeline(profile: torch.profiler.profile, steps: int) -> dict[str, float]:
    """Per step: the span from the first kernel's start to the last one's end, and how much of it
    no kernel ran (launch gaps and host waits), from the profile's trace."""
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "trace.json"
        profile.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "kernel"
    )
    if not kernels:
        return {}
    busy, end = 0.0, kernels[0][0]
    for start, stop in kernels:  # the union of the kernels' intervals, streams overlapping
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - kernels[0][0]
    return {
        "span ms": round(span / 1e3 / steps, 3),
        "idle ms": round((span - busy) / 1e3 / steps, 3),
    }


def kernel_kinds(profile: torch.profiler.profile, steps: int) -> dict[str, float]:
    """Per step: device milliseconds by kernel kind, from the device's own events alone (the host
    op that launched a kernel carries its time again), kernel launches and host syncs."""
    summary: dict[str, float] = {}
    for event in profile.key_averages():
        if on_device(event):
            kind = next((k for k, pattern in KERNEL_KINDS if pattern.search(event.key)), "other")
            device_ms = event.self_device_time_total / 1e3 / steps
            summary[f"{kind} ms"] = summary.get(f"{kind} ms", 0.0) + device_ms
        elif LAUNCHES.search(event.key):
            summary["launches"] = summary.get("launches", 0.0) + event.count / steps
        elif SYNCS.search(event.key):
            summary["host syncs"] = summary.get("host syncs", 0.0) + event.count / steps
    return {key: round(value, 3) for key, value in sorted(summary.items())}


def host_ops(profile: torch.profiler.profile, steps: int) -> dict[str, object]:
    """Per step: the host's milliseconds inside the profiled ops and regions, each counted by its
    own time (its children's apart; the backward's thread too), and the ops that take most. A
    fused op's own time is the Python that launches its Triton kernels."""
    host = [event for event in profile.key_averages() if event.device_type == DeviceType.CPU]
    top = sorted(host, key=lambda e: -e.self_cpu_time_total)[:TOP_HOST_OPS]
    return {
        "host ms": round(sum(e.self_cpu_time_total for e in host) / 1e3 / steps, 3),
        "top host ops": [
            [e.key[:80], round(e.self_cpu_time_total / 1e3 / steps, 3), e.count / steps]
            for e in top
        ],
    }


def device_ops(profile: torch.profiler.profile, steps: int) -> dict[str, object]:
    """Per step: the host ops whose own kernels take the device longest, each with its inputs'
    shapes. A kernel the profile names by its template alone (``elementwise_kernel<128, 4>``) is
    found by the op that launched it and the tensors it ran over."""
    ops = [
        event
        for event in profile.key_averages(group_by_input_shape=True)
        if event.device_type == DeviceType.CPU
        and not event.is_user_annotation
        and event.self_device_time_total > 0
    ]
    top = sorted(ops, key=lambda e: -e.self_device_time_total)[:TOP_DEVICE_OPS]
    return {
        "top device ops": [
            [
                e.key[:60],
                str(e.input_shapes)[:160],
                round(e.self_device_time_total / 1e3 / steps, 3),
                e.count / steps,
            ]
            for e in top
        ]
    }


def on_device(event: Any) -> bool:
    """A kernel, copy or fill that ran on the device: not a host event with device time, nor a
    ``record_function`` region drawn over the device's timeline (the optimiser's step)."""
    device = event.device_type != DeviceType.CPU and not event.is_user_annotation
    return device and event.self_device_time_total > 0


def inference_seconds(
    model: BiLM, baseline: StraightforwardBiLM, sentences: int, device: torch.device, bf16: bool
) -> dict[str, tuple[float, int]]:
    """Seconds to embed ``sentences`` of real-looking lengths (3–60 tokens), and their tokens."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 61, (sentences,), generator=generator)  # (S,)
    width = model.config.char_cnn.max_chars_per_token
    ids = torch.randint(98, 124, (sentences, int(lengths.max()), width), generator=generator)
    ids[:, :, 0], ids[:, :, 12:] = 259, 261  # begin-of-word, then padding chars
    ids[:, :, 11] = 260  # end-of-word
    ids[torch.arange(int(lengths.max())) >= lengths.unsqueeze(1)] = 0  # (S, T, W) padded
    ids = ids.to(device)
    model.eval()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def ours() -> None:
        with torch.no_grad(), autocast:
            model(ids)

    def straightforward() -> None:
        with torch.no_grad(), autocast:
            baseline(ids)

    tokens = int(lengths.sum())
    timed = {"ours": ours, "straightforward": straightforward}
    sync = synchronizer(device)
    result = {name: (seconds_per_call(run, 5, 2, sync), tokens) for name, run in timed.items()}
    model.train()
    return result


def on_fake_cuda(config: ModelConfig, args: argparse.Namespace) -> dict[str, object]:
    """Two windows of ours' loss, carried, with bf16 autocast on device ``cuda`` under
    ``FakeTensorMode``: the forward's CUDA code paths (autocast, the fused ops' CUDA dispatch, no
    data-dependent shapes) on a CPU, with a torch built for CUDA. The host's work (windows, token
    types, candidates, softmax rows) is done first, outside the fake mode, as the data loader does
    it. The backward stays on the meta device: autograd's engine wants a real CUDA context."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    width = config.char_cnn.max_chars_per_token
    windows, types, targets = synthetic_windows(
        args.batch, args.window, args.vocab, args.types, width, cpu
    )
    ahead = found_ahead(SampledSoftmax(args.vocab, 1, config.num_samples), targets, pinned=False)
    recipe = TrainConfig(batch_size=args.batch, unroll_steps=args.window, bf16=True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        with cuda:  # built there: a module's .to() cannot swap in fake parameters
            model = BiLM(config, args.vocab).train()
        on_cuda = {name: tensor.to(cuda) for name, tensor in windows.items()}
        types_on_cuda = TokenTypes(
            types.char_ids.to(cuda), types.inverse.to(cuda), types.used_width
        )
        step = TrainingStep.build(model, recipe, "sparse")
        first, second = (  # on the device already: a pinned copy would ask the driver
            SampledCandidates(drawn.ids.to(cuda), drawn.num_tries) for drawn in ahead[0][:2]
        )
        rows = ahead[1][0].to(cuda)
        state = None
        # autocast asks the driver, and turns itself off where none answers; fake tensors need
        # none. Inductor asks it for the GPU's properties: the sampled loss's epilogues run as
        # they are (their compiled form is tested on a GPU).
        answers = {"is_available": lambda: True, "is_bf16_supported": lambda *_, **__: True}
        eager = mock.patch.object(softmax_module, "compile_epilogues", lambda hidden: False)
        with (
            mock.patch.multiple(torch.cuda, **answers),
            eager,
            torch.autocast("cuda", torch.bfloat16),
        ):
            for _ in range(2):  # the second window from the carried state
                output, state = step.module(
                    **on_cuda,
                    state=state,
                    candidates=(first, second),
                    types=types_on_cuda,
                    softmax_rows=rows,
                )
        loss = output.loss
        top_dtype = step.bilm.softmax.weight.dtype if step.bilm.softmax is not None else None
    return {
        "device": "fake cuda",
        "preset": args.preset,
        "lstm_impl": args.lstm_impl,
        "batch_directions": args.batch_directions,
        "windows": 2,
        "loss": f"{tuple(loss.shape)} {loss.dtype} on {loss.device}",
        "state": f"{tuple(state[0].c.shape)} {state[0].c.dtype}",
        "softmax_weight": str(top_dtype),
    }


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="original")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=793_471)
    parser.add_argument("--types", type=int, default=50_000, help="distinct synthetic words")
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps after warm-up")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument(
        "--lstm-impl",
        default="reference",
        choices=VARIANTS,
    )
    parser.add_argument(
        "--batch-directions", action="store_true", help="both LSTM stacks as one batched stack"
    )
    parser.add_argument(
        "--capture-step",
        action="store_true",
        help="train.capture_step: ours as one CUDA graph replay a step (shape buckets on); "
        "elsewhere the bucketed step runs eagerly",
    )
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument("--sweep", default="", help="more rows per GPU to time ours at: 256,512")
    parser.add_argument("--profile", action="store_true", help="where ours spends a step")
    parser.add_argument("--inference", action="store_true", help="embedding 64 sentences")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: a CPU check of the script"
    )
    parser.add_argument(
        "--only",
        choices=["sweep", "inference", "profile"],
        help="time only the sweep's batches, only inference or only profile ours (one part of "
        "the GPU suite)",
    )
    parser.add_argument(
        "--device",
        help="default cuda where there is one, else cpu; meta stands in for CUDA on a CPU "
        "(every tensor must be on it, as on a GPU; the times mean nothing); fake-cuda runs two "
        "steps on device cuda under FakeTensorMode (a torch built for CUDA, no GPU needed)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.batch, args.window, args.vocab, args.types = "tiny", 4, 5, 200, 50
        args.steps, args.warmup = 1, 1
    return args


def bench_config(args: argparse.Namespace) -> ModelConfig:
    """The preset with the asked LSTM variant (cuDNN's without the clips it cannot apply)."""
    config = model_preset(args.preset)
    if args.lstm_impl == "cudnn":
        lstm = config.lstm.model_copy(update={"cell_clip": None, "proj_clip": None})
        config = config.model_copy(update={"lstm": lstm})
    return config.model_copy(
        update={"lstm_impl": args.lstm_impl, "batch_directions": args.batch_directions}
    )


class Bench:
    """One device's model, its step at the asked rows, and the figures timed so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.bf16 = self.device.type == "cuda" and not args.no_bf16  # autocast has no meta device
        self.config = bench_config(args)
        torch.manual_seed(0)
        self.model = BiLM(self.config, args.vocab).to(self.device).train()
        self.baseline = StraightforwardBiLM(self.model)
        self.recipe = TrainConfig(
            batch_size=args.batch,
            unroll_steps=args.window,
            bf16=self.bf16,
            shape_buckets=args.capture_step,
            capture_step=args.capture_step and self.device.type == "cuda",
        )
        # The meta device has no sparse kernels: there the softmax's gradient is dense.
        self.exchange: ExchangeMode = "dense" if self.device.type == "meta" else "sparse"
        self.windows, self.types, self.step, self.ours = self.training_step(args.batch)
        self.peak_memory: dict[str, int] = {}  # bytes, where CUDA counts them
        self.peak = matmul_flops_per_second(
            self.device, 256 if args.smoke else 8192, torch.bfloat16 if self.bf16 else torch.float32
        )
        self.flops_per_position = training_flops_per_position(self.config)
        self.summary: dict[str, object] = {}

    def training_step(
        self, rows: int
    ) -> tuple[Any, TokenTypes, TrainingStep, Callable[[], object]]:
        """Synthetic windows of ``rows`` rows, the worker's step over them and one call of it."""
        args = self.args
        width = self.config.char_cnn.max_chars_per_token
        windows, types, host_targets = synthetic_windows(
            rows, args.window, args.vocab, args.types, width, self.device, args.capture_step
        )
        recipe = self.recipe.model_copy(update={"batch_size": rows})
        step = TrainingStep.build(self.model, recipe, self.exchange)
        return windows, types, step, worker_step(step, windows, types, host_targets)

    def timed(self, name: str, run: Callable[[], object]) -> float:
        """Seconds a call of ``run`` takes, and its peak memory where CUDA counts it."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        value = seconds_per_call(run, self.args.steps, self.args.warmup, synchronizer(self.device))
        if cuda:
            self.peak_memory[name] = torch.cuda.max_memory_allocated()
        return value

    def time_both(self) -> dict[str, float]:
        """Ours and the straightforward model at the asked rows (unless only one part runs: each
        compiled shape costs a compile, so a part times only its own)."""
        if self.args.only is not None:
            return {}
        straightforward = straightforward_step(
            self.model, lambda: self.baseline.training_loss(self.windows), self.bf16
        )
        return {
            "ours": self.timed("ours", self.ours),
            "straightforward": self.timed("straightforward", straightforward),
        }

    def header(self) -> None:
        """What runs where, printed, and the summary's first keys."""
        args, device = self.args, self.device
        print(f"{device} {torch.cuda.get_device_name() if device.type == 'cuda' else ''}".strip())
        print(
            f"preset {args.preset}, lstm {args.lstm_impl}"
            f"{' (directions batched)' if args.batch_directions else ''}"
            f"{', the step captured' if self.recipe.capture_step else ''}, "
            f"batch {args.batch} x {args.window}, "
            f"vocab {args.vocab}, bf16 {self.bf16}"
        )
        print(
            f"matmul peak {self.peak / 1e12:.1f} TFLOP/s; "
            f"{self.flops_per_position / 1e9:.3f} GFLOP/position"
        )
        print(f"{'implementation':20} {'s/step':>8} {'positions/s':>12} {'MFU':>7}")
        self.summary |= {
            "device": device.type,
            "preset": args.preset,
            "lstm_impl": args.lstm_impl,
            "batch_directions": args.batch_directions,
            "capture_step": self.recipe.capture_step,
            "shape_buckets": self.recipe.shape_buckets,
            # the rows the char CNN encodes a step: the distinct types, padded to a bucket
            "token_types": int(self.types.char_ids.shape[0]),
            "batch": args.batch,
            "window": args.window,
            "bf16": self.bf16,
        }

    def report(self, name: str, value: float, rows: int) -> None:
        """One implementation's row: seconds a step, positions a second, model FLOP use."""
        rate = rows * self.args.window / value
        utilisation = self.flops_per_position * rate / self.peak
        print(f"{name:20} {value:8.3f} {rate:12.0f} {utilisation:7.2%}")
        self.summary[f"{name}_positions_per_s"] = round(rate, 1)
        self.summary[f"{name}_mfu"] = float(f"{utilisation:.3g}")
        if name in self.peak_memory:
            self.summary[f"{name}_peak_gib"] = round(self.peak_memory[name] / 2**30, 2)

    def report_both(self, seconds: dict[str, float]) -> None:
        for name, value in seconds.items():
            self.report(name, value, self.args.batch)
        if "ours" in seconds:
            self.summary |= replayed("ours", self.step)
        if seconds:
            self.summary["ratio"] = round(seconds["straightforward"] / seconds["ours"], 3)
        self.summary["matmul_tflops"] = round(self.peak / 1e12, 2)

    def sweep(self) -> None:
        """Ours at each of ``--sweep``'s row counts."""
        sweep = self.args.sweep if self.args.only in (None, "sweep") else ""
        for rows in (int(value) for value in sweep.split(",") if value):
            _, types, step, run = self.training_step(rows)
            self.report(f"ours@{rows}", self.timed(f"ours@{rows}", run), rows)
            self.summary[f"ours@{rows}_token_types"] = int(types.char_ids.shape[0])
            self.summary |= replayed(f"ours@{rows}", step)

    def profile(self) -> None:
        """Where a step of ours goes, when asked."""
        args = self.args
        if (args.profile and args.only is None) or args.only == "profile":
            profile = where_the_time_goes(self.ours, args.steps, args.warmup)
            print(f"where a step of ours goes (per step, batch {args.batch}): {profile}")
            self.summary["profile"] = profile

    def inference(self) -> None:
        """Embedding 64 sentences with ours and the straightforward model, when asked."""
        if not (self.args.inference or self.args.only == "inference"):
            return
        timed = inference_seconds(self.model, self.baseline, 64, self.device, self.bf16)
        for name, (value, tokens) in timed.items():
            print(f"inference {name:14} {value:8.4f} s {tokens / value:12.0f} tokens/s")
            self.summary[f"inference_{name}_tokens_per_s"] = round(tokens / value, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.device == "fake-cuda":
        if torch.version.cuda is None:
            print_summary({"device": "fake cuda", "skipped": "this torch is built without CUDA"})
        else:
            print_summary(on_fake_cuda(bench_config(args), args))
        return 0
    bench = Bench(args)
    seconds = bench.time_both()
    bench.header()
    bench.report_both(seconds)
    bench.sweep()
    bench.profile()
    bench.inference()
    print_summary(bench.summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
