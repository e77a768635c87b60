"""The first call on a lent GPU: everything that matters, in the order it matters, in one command.

A lent task has 15 device-minutes in all, starts included, so this one call must fit 7 minutes
(``TOTAL_SECONDS`` from its own start, after the wheels are installed) and leave room for one
short rerun. Its stages (environment, correctness, speed, profile, inference if time remains; see
``stages``) run in turn, each in its own process and time box; each one's output is appended to
``OUT/first-contact.log`` as it ends, so a run killed at the device's limit keeps what finished.
The log's last line is one JSON object with every figure and each stage's status.

    python -m infra.device.first_contact OUT [--rehearse]

``--rehearse``: tiny sizes on a CPU, through the same stages and boxes (``rehearse.py`` runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TOTAL_SECONDS = 400  # the stages' share of the 7 minutes; installing the wheels takes the rest
REPO = Path(__file__).resolve().parents[2]
LOG = "first-contact.log"
TESTS_REPORT = "first-contact-tests.xml"
CORRECTNESS_TESTS = [
    "tests/integration/test_allennlp_parity.py",
    "tests/unit/elmo_core/model/lstm/test_fused_training.py",
    "tests/unit/elmo_core/model/lstm/test_fused_inference.py",
    "tests/unit/elmo_core/model/lstm/test_triton_kernels.py",
    "tests/unit/elmo_core/model/lstm/test_compiled.py",
    "tests/unit/elmo_core/model/test_softmax.py",
    "tests/unit/elmo_core/training/test_bf16_on_cuda.py",
    "tests/unit/elmo_core/training/test_step_graphs.py",
]
# Within those files, the checks on CUDA (and the Triton kernels'): their CPU tests ran in CI.
CORRECTNESS_CHECKS = "cuda or kernel or triton or buffer or bf16 or host"
BF16_STEPS = 100  # the bf16 test's curve (ELMO_BF16_STEPS): 50 settled steps past its steep start
ENVIRONMENT = """
import json, subprocess, sys, torch
from infra.device.gpu_bilm import matmul_flops_per_second
cuda = torch.cuda.is_available()
figures = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
if cuda:
    props = torch.cuda.get_device_properties(0)
    figures |= {"gpu": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                "sm_count": props.multi_processor_count}
    query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                         capture_output=True, text=True)
    figures["nvidia_smi"] = dict(zip(query.split(","), smi.stdout.strip().split(", ")))
device, size = (torch.device("cuda"), 8192) if cuda else (torch.device("cpu"), 256)
dtype = torch.bfloat16 if cuda else torch.float32
figures["matmul_tflops"] = round(matmul_flops_per_second(device, size, dtype) / 1e12, 2)
figures["matmul"] = f"{size}^3 {dtype}"
print(json.dumps(figures))
"""


@dataclass(frozen=True)
class Stage:
    """One step of the run: its commands, run in turn within ``box`` seconds."""

    name: str
    box: float
    commands: list[list[str]]
    optional: bool = False  # run only if the whole run's time allows its box


def stages(out: Path, rehearse: bool) -> list[Stage]:
    """The run's stages, at the device's sizes or, rehearsing, at tiny ones."""
    python = os.environ.get("PYTHON", sys.executable)
    plain = [python, "-m", "infra.device.gpu_bilm", *(["--smoke"] if rehearse else [])]
    bilm = [*plain, "--device", "meta"] if rehearse else plain  # CUDA's device rules, on a CPU
    batched = ["--lstm-impl", "fused", "--batch-directions"]
    # graphed, the CUDA default, compiles: in a rehearsal it runs on the CPU, meta cannot
    graphed = [*plain, "--lstm-impl", "graphed", "--batch-directions"]
    small, rows = ("4", "8") if rehearse else ("128", "1024")
    pytest = [*correctness_tests(python), "--junitxml", str(out / TESTS_REPORT)]
    # Boxes: half again the stage times measured on the last call (first_contact_budget.MEASURED_S;
    # all boxes together fit first_contact_budget.LIMIT_S).
    return [
        # GPU, memory, clocks, driver, torch and CUDA; the bf16 matmul rate on 8192³ (the MFU
        # denominator)
        Stage("environment", 30, [[python, "-c", ENVIRONMENT]]),
        # golden bilm-tf parity in fp32 on CUDA, the fused layer and its Triton kernels against the
        # reference, graphed (CUDA's choice) against fused, the compiled softmax epilogues against
        # eager, 100 steps of bf16 against fp32, a training step with no host sync, the captured
        # step against the eager one and its replays with no host sync
        Stage("correctness", 142, [pytest]),
        # at original, directions batched: graphed (what users get on CUDA) against the
        # straightforward baseline at 128 rows, then at 1,024; fused beside it at both, then the
        # whole step captured (train.capture_step) at both: positions/s, MFU, peak memory
        Stage(
            "speed",
            139,
            [
                *([[*plain, "--device", "fake-cuda", *batched]] if rehearse else []),
                [*graphed, "--sweep", rows],
                [*bilm, *batched, "--only", "sweep", "--sweep", f"{small},{rows}"],
                [
                    *bilm,
                    *batched,
                    "--capture-step",
                    "--only",
                    "sweep",
                    "--sweep",
                    f"{small},{rows}",
                ],
            ],
        ),
        # where a fused step's time goes: the longest kernels, GEMM and pointwise time, the GPU's
        # idle gaps, launches and host syncs per step
        Stage(
            "profile",
            60,
            [[*plain, *batched, "--only", "profile"]],  # the CPU profiles, meta cannot
        ),
        Stage(
            "inference",
            25,
            [[*plain, *batched, "--only", "inference"]],
            optional=True,
        ),
    ]


def correctness_tests(python: str) -> list[str]:
    """The correctness stage's pytest command, its plugins named (the device's site has no
    entry points to load them by)."""
    pytest = [python, "-m", "pytest", "-q", "-p", "pytest_timeout", "-p", "no:cacheprovider"]
    return [*pytest, "-k", CORRECTNESS_CHECKS, *CORRECTNESS_TESTS]


def stage_environment() -> dict[str, str]:
    """What every stage runs with: this one's, the repository importable."""
    environment = dict(os.environ) | {
        "ELMO_BF16_STEPS": str(BF16_STEPS),
        "PYTHONUNBUFFERED": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # plugins by -p, as the device's --target site has
    }
    environment["PYTHONPATH"] = f"{REPO}{os.pathsep}{environment.get('PYTHONPATH', '')}"
    return environment


def run_stage(stage: Stage, log: Path, environment: dict[str, str]) -> dict[str, object]:
    """The stage's commands in turn, each its own process group, stopped at the box; what each
    printed is appended to ``log`` as it ends. A command is done when its process exits: children
    it left behind (compile workers holding its output open) are stopped then, and do not make a
    finished command look stopped at the box. The result: status, seconds, each command's last
    JSON line."""
    start, results, status = time.monotonic(), [], "ok"
    for command in stage.commands:
        left = stage.box - (time.monotonic() - start)
        if left <= 0:
            status = "stopped at its box"
            break
        with tempfile.TemporaryFile("w+", encoding="utf-8") as captured:
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=environment,
                stdout=captured,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                process.wait(timeout=left)
            except subprocess.TimeoutExpired:
                status = "stopped at its box"
            with contextlib.suppress(ProcessLookupError):  # whatever it left running
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            captured.seek(0)
            output = captured.read()
        if status == "ok" and process.returncode != 0:
            status = f"failed (exit {process.returncode})"
        with log.open("a", encoding="utf-8") as handle:
            handle.write(f"=== {stage.name}: {' '.join(command[:4])} ...\n{output}")
        results.append(_result(output))
        if status != "ok":
            break
    return {"status": status, "seconds": round(time.monotonic() - start, 1), "results": results}


def _result(output: str) -> object:
    """A command's last JSON line, else its last line (pytest's count of passed and failed)."""
    lines = output.strip().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return lines[-1] if lines else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rehearse", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / LOG
    environment = stage_environment()
    started, summary = time.monotonic(), {"stages": {}}
    for stage in stages(args.out, args.rehearse):
        left = TOTAL_SECONDS - (time.monotonic() - started)
        if stage.optional and left < stage.box:
            summary["stages"][stage.name] = {"status": f"skipped: {left:.0f} s left"}
            continue
        result = run_stage(stage, log, environment)
        summary["stages"][stage.name] = result
        with log.open("a", encoding="utf-8") as handle:  # the stage's result, as it ends
            handle.write(f"STAGE {stage.name} {json.dumps(result)}\n")
        print(f"{stage.name:12} {result['status']:24} {result['seconds']:6.1f} s", flush=True)
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["rehearsal"] = args.rehearse
    with log.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))
    optional = {stage.name for stage in stages(args.out, args.rehearse) if stage.optional}
    failed = [  # an optional stage may stop at its box: it ran in what time was left
        name
        for name, result in summary["stages"].items()
        if result["status"] != "ok" and name not in optional
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
