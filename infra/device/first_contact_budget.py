"""The first-contact run's device time, PREDICTED per stage before a GPU sees it.

The first-contact call must fit 420 s so that one short rerun still fits a task's 15 device-minutes.
This predicts each stage's time from what it measures here (with the device's torch, at the
device's sizes: see ``Measured``) and a stated model for the rest (the constants below;
docs/architecture.md, "Where a step's time goes"). It fails if the whole call is predicted over
``LIMIT_S`` or a stage over its box (that stage would be stopped, its figures lost).

    python -m infra.device.first_contact_budget [--kernels triton_aot.json] [--carried .device]

Last line: one JSON object, the prediction per stage; results in
benchmarks/results/first_contact_rehearsal-2026-11-27.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.bench_step_ops import VARIANTS, count_step
from benchmarks.workload import synthetic_windows, training_flops_per_position
from infra.device.first_contact import (
    BF16_STEPS,
    REPO,
    TOTAL_SECONDS,
    correctness_tests,
    stage_environment,
    stages,
)
from infra.device.gpu_bilm import STEPS, WARMUP

LIMIT_S = 420  # the call's timeout is 480: the rest is the margin for a rerun to fit
# The model of an H100 in docs/architecture.md, "Where a step's time goes".
LAUNCH_S, PEAK_FLOPS, EFFICIENCY = 5e-6, 800e12, 0.5
CUDA_START_S = 8.0  # a process' CUDA context, cuBLAS handle and lazily loaded kernels
CUDA_TEST_S = 1.0  # one CUDA parity test past its setup: a few small steps at tiny sizes
INDUCTOR_S = 10.0  # a training process' first Inductor compiles: Dynamo and Inductor warmed up,
# the sampled loss's two chunk epilogues compiled per chunk shape (the bf16 test's graphed LSTM too)
PROFILER_FACTOR = 2.0  # recorded steps run slower
HOST_TO_GPU = 10e9  # bytes/s, a model's parameters from pageable host memory
BF16_RUNS, BF16_ROWS = 2, 128  # the bf16 test's runs (fp32 and bf16) and rows
ORIGINAL_VOCAB, TYPES, WINDOW = 793_471, 50_000, 20  # gpu_bilm.py's defaults
MATMUL_CALLS = 13  # gpu_bilm.matmul_flops_per_second's warm-up and timed calls
MATMUL_SIZE = 8192
COUNTED = [  # (variant, rows) of original whose launches are counted
    ("fused_batched", 128),
    ("fused_batched", 1024),
    ("reference_batched", 128),
    ("reference_apart", 128),  # the straightforward baseline's stand-in
]
# small leaves lstm_impl "auto": on CUDA, graphed with directions apart, whose replays launch less
# than the fused ops it captures: their launches bound its step from above
SMALL_VARIANT = "fused_apart"
TRITON_GUESS_S = 1.0  # per kernel and dtype, where triton_aot.py did not run (no triton here)
TRITON_LAUNCHER_S = 1.5  # per kernel and dtype: the C launcher Triton builds on first launch
STEP_DTYPES = ("fp32", "bf16")  # the kernels' GEMM dtypes the correctness and speed steps run
GRAPHED_COMPILE_S = 15.0  # graphed's compile and CUDA-graph capture, per shape: a guess to refit
CAPTURE_S = 5.0  # the whole step's capture (its warm-up steps are counted), per shape: a guess
# The refit: the last call's stage times (the lent H200's first contact, the tree of 38fafaa)
# against what this model predicted for them then (the rehearsal on 2 vCPUs). The model prices
# the work it can count; what it missed (lazy loading, compiles, the profiler's own time) is added
# to each stage as a fixed sum, not scaled with the model's figure. Where the model overprices a
# stage (the speed stage's guessed compile and capture times), that sum is negative.
MEASURED_S = {
    "environment": 6.5,
    "correctness": 94.5,
    "speed": 92.3,
    "profile": 39.5,
    "inference": 16.2,
}
MODEL_THEN_S = {
    "environment": 9.7,
    "correctness": 60.8,
    "speed": 121.6,
    "profile": 26.6,
    "inference": 16.6,
}
UNMODELLED_S = {stage: MEASURED_S[stage] - MODEL_THEN_S[stage] for stage in MEASURED_S}


@dataclass(frozen=True)
class Measured:
    """What this machine measured, at the device's sizes."""

    install_s: float
    start_s: float  # a fresh process, torch and elmo_core imported
    build_s: dict[str, float]  # preset: building the model on the host
    parameter_bytes: dict[str, int]  # preset
    windows_s: float  # the synthetic windows at 1,024 rows
    prepare_s: float  # the bf16 test's corpus
    collect_s: float  # pytest collecting the correctness tests
    cuda_tests: int  # of those, the ones that run only on CUDA
    launches: dict[str, int]  # "preset/variant/rows": launches per step
    flops: dict[str, float]  # preset: training FLOPs per position
    triton_s: float  # compiling every kernel in the dtypes the steps use


def step_seconds(measured: Measured, preset: str, variant: str, rows: int) -> float:
    """One training step on the model's H100: launch-bound or FLOP-bound."""
    launches = measured.launches[f"{preset}/{variant}/{rows}"]
    flops = measured.flops[preset] * rows * WINDOW
    return max(launches * LAUNCH_S, flops / (PEAK_FLOPS * EFFICIENCY))


def predict(measured: Measured) -> dict[str, float]:
    """Seconds per stage of ``first_contact.py``, and ``install`` before them."""
    process = measured.start_s + CUDA_START_S
    original = (
        measured.build_s["original"]
        + measured.parameter_bytes["original"] / HOST_TO_GPU
        + 2 * measured.windows_s
    )
    timed = STEPS + WARMUP

    def step(variant: str, rows: int, preset: str = "original") -> float:
        return step_seconds(measured, preset, variant, rows)

    matmul = MATMUL_CALLS * 2 * MATMUL_SIZE**3 / (PEAK_FLOPS * EFFICIENCY)
    small = measured.build_s["small"] + measured.parameter_bytes["small"] / HOST_TO_GPU
    bf16_step = step(SMALL_VARIANT, BF16_ROWS, "small")
    correctness = (
        process
        + INDUCTOR_S
        + measured.collect_s
        + measured.prepare_s
        + measured.triton_s
        + measured.cuda_tests * CUDA_TEST_S
        + (BF16_RUNS + 1) * small  # two loss curves and the host-sync check
        + (BF16_RUNS * BF16_STEPS + 2) * bf16_step
    )
    # graphed (its replays launch less than the fused ops it captures: fused's launches bound it)
    # against the straightforward baseline at 128 rows and alone at 1,024, then fused at both,
    # then the captured step at both (fused's launches bound it too)
    speed = (
        3 * (process + INDUCTOR_S + original + matmul)
        + 2 * (GRAPHED_COMPILE_S + CAPTURE_S)
        + timed * (step("fused_batched", 128) + step("reference_apart", 128))
        + 3 * timed * (step("fused_batched", 128) + step("fused_batched", 1024))
    )
    profile = (
        process
        + INDUCTOR_S
        + original
        + matmul
        + (1 + STEPS * PROFILER_FACTOR) * step("fused_batched", 128)
    )
    inference = process + original + matmul + 2 * timed * step("fused_batched", 128)
    return {
        "install": measured.install_s,
        "environment": process + matmul,
        "correctness": correctness,
        "speed": speed,
        "profile": profile,
        "inference": inference,
    }


def verdict(model: dict[str, float]) -> tuple[dict[str, object], list[str]]:
    """Each stage's prediction (the ``model``'s seconds refit: :data:`UNMODELLED_S`) against its
    box and beside the last measured time, the optional stage run only where time is left, the
    whole call against ``LIMIT_S``; and what is wrong, each named."""
    rows, problems, used = {}, [], 0.0
    for stage in stages(Path(tempfile.gettempdir()), rehearse=False):
        seconds = model[stage.name] + UNMODELLED_S.get(stage.name, 0.0)
        row = {
            "model_s": round(model[stage.name], 1),
            "predicted_s": round(seconds, 1),
            "measured_s": MEASURED_S.get(stage.name),
            "box_s": stage.box,
        }
        if stage.optional and TOTAL_SECONDS - used < stage.box:
            rows[stage.name] = row | {"runs": False}
            continue
        used += min(seconds, stage.box)
        rows[stage.name] = row | {"runs": True}
        if seconds > stage.box and not stage.optional:
            problems.append(
                f"{stage.name} predicted {seconds:.0f} s, over its {stage.box:.0f} s box"
            )
    total = model["install"] + used
    if total > LIMIT_S:
        problems.append(f"the call predicted {total:.0f} s, over {LIMIT_S} s")
    summary = {
        "install_s": round(model["install"], 1),
        "stages": rows,
        "total_s": round(total, 1),
    }
    return summary, problems


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(kernels: Path | None, carried: Path | None) -> Measured:
    """Everything :func:`predict` needs that this machine can measure."""
    from elmo_core.config import PrepareConfig
    from elmo_core.data.reader import load_manifest
    from elmo_core.model.bilm import BiLM
    from elmo_core.presets import model_preset
    from pipelines.prepare.corpus_sources import SAMPLE_CORPUS, locate_corpus
    from pipelines.prepare.stage import prepare_files

    python = os.environ.get("PYTHON", sys.executable)
    with tempfile.TemporaryDirectory() as scratch:
        install_s = 0.0
        if carried is not None:  # as gpu_suite.sh installs them on the device
            command = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            command += ["--no-compile", "--no-cache-dir", "--target", f"{scratch}/site"]
            wheels = [str(path) for path in sorted((carried / "wheels").glob("*.whl"))]
            install_s = timed(lambda: subprocess.run([*command, *wheels], check=True))
        imports = "import torch, elmo_core.training.step, elmo_core.model.bilm"
        start = [python, "-c", imports]
        start_s = timed(
            lambda: subprocess.run(start, check=True, cwd=REPO, env=stage_environment())
        )
        corpus = locate_corpus(SAMPLE_CORPUS, "text", Path(scratch) / "cache")
        dataset = f"{scratch}/dataset"
        prepare_s = timed(lambda: prepare_files(PrepareConfig(format="text"), corpus, dataset))
        small_vocab = load_manifest(dataset).vocab.size
        started = time.perf_counter()
        listed = subprocess.run(
            [*correctness_tests(python), "--collect-only"],
            cwd=REPO,
            env=stage_environment(),
            capture_output=True,
            text=True,
        )
        collect_s = time.perf_counter() - started
        if listed.returncode != 0:
            output = listed.stdout + listed.stderr
            raise SystemExit(f"the correctness tests do not collect:\n{output[-3000:]}")
    tests = [line for line in listed.stdout.splitlines() if "::" in line]
    build_s, parameter_bytes, flops = {}, {}, {}
    for preset, vocab in (("original", ORIGINAL_VOCAB), ("small", small_vocab)):
        config = model_preset(preset)
        build_s[preset] = timed(lambda: BiLM(config, vocab))  # noqa: B023 (called at once)
        with torch.device("meta"):
            model = BiLM(config, vocab)
        parameter_bytes[preset] = sum(p.numel() * p.element_size() for p in model.parameters())
        flops[preset] = training_flops_per_position(config)
    width = model_preset("original").char_cnn.max_chars_per_token
    cpu = torch.device("cpu")
    windows_s = timed(lambda: synthetic_windows(1024, WINDOW, ORIGINAL_VOCAB, TYPES, width, cpu))
    counted = [("original", v, rows) for v, rows in COUNTED] + [("small", SMALL_VARIANT, BF16_ROWS)]
    launches = {}
    for preset, variant, rows in counted:
        vocab = ORIGINAL_VOCAB if preset == "original" else small_vocab
        types = TYPES if preset == "original" else min(TYPES, small_vocab)
        counts = count_step(preset, variant, rows, WINDOW, vocab, types, "meta")
        # the fused op's inside ops counted one launch each, as the torch path would run them
        launches[f"{preset}/{variant}/{rows}"] = counts.flattened
    return Measured(
        install_s=install_s,
        start_s=start_s,
        build_s=build_s,
        parameter_bytes=parameter_bytes,
        windows_s=windows_s,
        prepare_s=prepare_s,
        collect_s=collect_s,
        cuda_tests=sum("cuda" in test.lower() for test in tests),
        launches=launches,
        flops=flops,
        triton_s=triton_seconds(kernels),
    )


def triton_seconds(kernels: Path | None) -> float:
    """The compile seconds of every kernel the steps run, from ``triton_aot.py``'s last line."""
    if kernels is None:
        return (TRITON_GUESS_S + TRITON_LAUNCHER_S) * 3 * len(STEP_DTYPES)
    rows = json.loads(kernels.read_text().strip().splitlines()[-1])["kernels"]
    used = [row for row in rows if row["gemm"] in STEP_DTYPES]
    return sum(row["seconds"] + TRITON_LAUNCHER_S for row in used)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=Path, help="triton_aot.py's output")
    parser.add_argument("--carried", type=Path, help="the folder the device call carries")
    args = parser.parse_args(argv)
    assert set(VARIANTS) >= {variant for variant, _ in COUNTED}
    measured = measure(args.kernels, args.carried)
    predicted = predict(measured)
    summary, problems = verdict(predicted)
    print("PREDICTED first-contact device time (a model refit to the last call; see --help)")
    print(f"{'stage':12} {'model':>7}   {'refit':>7}   {'last measured':>13}   box")
    print(f"{'install':12} {predicted['install']:7.1f} s")
    for name, row in summary["stages"].items():  # type: ignore[union-attr]
        runs = "" if row["runs"] else "  (skipped: no time left)"
        last = "-" if row["measured_s"] is None else f"{row['measured_s']:.1f} s"
        print(
            f"{name:12} {row['model_s']:7.1f} s {row['predicted_s']:7.1f} s {last:>13}   "
            f"{row['box_s']:5.0f} s{runs}"
        )
    print(f"{'total':12} {summary['total_s']:7.1f} s  limit {LIMIT_S} s")
    for problem in problems:
        print(f"OVER: {problem}")
    summary["measured"] = {k: v for k, v in vars(measured).items()}
    summary["ok"] = not problems
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
