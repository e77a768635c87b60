"""The GPU suite rehearsed on a CPU, as the device machine would run it, before a GPU sees it.

It builds the device's environment from the project's own files (a fresh venv with the device's
Python and torch where found, and exactly the wheels ``device_env.py`` says to carry, installed as
the device installs them), compiles the Triton kernels for the H100 (``triton_aot.py``), runs every
part of ``gpu_suite.sh`` at tiny sizes, the meta device standing in for CUDA, and fails on any
problem the device would meet (``problems``). Last, it prints the device commands, one per part.

    python -m infra.device.rehearse [--parts tests,data] [--cache DIR]

Results: benchmarks/results/rehearsal-2026-11-25.md, first_contact_rehearsal-2026-11-27.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from infra.device.device_env import (
    CONSTRAINTS,
    DEVICE_PYTHON,
    IMAGE,
    REPO,
    baselines,
    carried_wheels,
    download,
    fetch,
    pinned_versions,
)

# It installs with its nvidia wheels (about 5 GB, cached with the environment) and runs on a CPU.
DEVICE_TORCH = "2.11.0"  # PyPI's, for Linux: the CUDA 13 build the device image has
PARTS = [
    "first-contact",
    "tests",
    "speed-reference",
    "speed-compiled",
    "speed-graphed",
    "speed-fused",
    "sweep-reference",
    "sweep-compiled",
    "sweep-graphed",
    "sweep-fused",
    "profile-fused",
    "profile-captured",
    "ab",
    "ab-graphed",
    "ab-captured",
    "two-ranks",
    "inference",
    "data",
    "recipe",
]
FIRST_CONTACT_TIMEOUT_S = 480  # its 7 minutes and a margin: one short rerun fits the budget
BUDGET_SECONDS = 300  # per part at tiny sizes; on the device each part has 600
MAX_FILES = 8  # what comes back from one device command
CARRY = ".device"
# What build() makes, by version: bump it when build() changes what the folder holds.
ENVIRONMENT_LAYOUT = "1: venv, carried, device-wheels"
TEST_PATHS = re.compile(r"^\s+(tests/\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Toolchain:
    """The interpreter and torch the rehearsal's venv is made with."""

    python: str  # an interpreter path
    version: str  # "3.12"
    torch: list[str]  # pip arguments that fetch torch
    stand_in: str  # why it is not the device's, or ""


def toolchain() -> Toolchain:
    """The device's Python and torch (PyPI's CUDA build, which runs on a CPU), else, where no
    Python 3.12 is found, this interpreter with constraints.txt's torch."""
    python = device_python()
    if python:
        return Toolchain(python, DEVICE_PYTHON, [f"torch=={DEVICE_TORCH}"], "")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    torch = f"torch=={pinned_versions()['torch']}"
    why = f"no python{DEVICE_PYTHON} here (pyenv install {DEVICE_PYTHON} gives one)"
    return Toolchain(
        sys.executable, version, [torch], f"{why}: stood in by Python {version} and {torch}"
    )


def device_python() -> str | None:
    """A Python of the device's version that runs: pyenv's, else one on PATH (not a shim
    that has no such version selected)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [str(path) for path in sorted(root.glob(f"{DEVICE_PYTHON}.*/bin/python3"))]
    candidates += filter(None, [shutil.which(f"python{DEVICE_PYTHON}")])
    for python in reversed(candidates):
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def build(tools: Toolchain, cache: Path) -> Path:
    """The environment's folder under ``cache`` (``venv``, ``carried``, and with a stand-in the
    device's own ``device-wheels``), keyed on everything that decides them; built in a temporary
    folder and renamed, so a killed build leaves nothing half-made."""
    key = hashlib.sha256(ENVIRONMENT_LAYOUT.encode())
    for path in (CONSTRAINTS, Path(__file__).with_name("device_env.py")):
        key.update(path.read_bytes())
    key.update(" ".join([tools.python, *tools.torch]).encode())
    home = cache / key.hexdigest()[:16]
    if not (home / "complete").is_file():
        shutil.rmtree(home, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=".building-"))
        print(f"building the device environment in {home} (once per constraints.txt)", flush=True)
        image = staging / "image-wheels"
        versions = pinned_versions()
        heavy = [f"{name}=={versions[name]}" for name in IMAGE if name != "torch"]
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
        pip += ["--python-version", tools.version, "-d", str(image)]
        subprocess.run([*pip, *tools.torch, *heavy], check=True)
        subprocess.run([tools.python, "-m", "venv", str(staging / "venv")], check=True)
        installed = [str(staging / "venv/bin/python"), "-m", "pip", "install", "-q", "--no-index"]
        subprocess.run(
            [*installed, "--find-links", str(image), "torch", *IMAGE[1:]],
            check=True,
            env=_without_index(),
        )
        fetch(staging / "carried", tools.version)
        if tools.stand_in:
            download(carried_wheels(DEVICE_PYTHON), staging / "device-wheels", DEVICE_PYTHON)
        shutil.rmtree(image)
        (staging / "complete").touch()
        staging.rename(home)  # the venv's scripts name staging's path: call its python by path
    return home


def check_device_wheels(wheels: Path, work: Path) -> str:
    """Where the stand-in's Python is not the device's: the wheels the device gets, for Python
    3.12, installed by the device's own command into a Python 3.12 and every module of them
    imported there with elmo_core's configs (torch aside). An empty string when all is well."""
    python = device_python()
    if python is None:
        return f"not checked: no python{DEVICE_PYTHON} here (pyenv install {DEVICE_PYTHON})"
    site = work / "device-site"
    install = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    install += ["--no-cache-dir", "--upgrade", "--target", str(site)]
    subprocess.run([*install, *map(str, wheels.glob("*.whl"))], check=True, env=_without_index())
    modules = sorted(
        path.name.removesuffix(".py")
        for path in site.iterdir()
        if path.name != "bin" and not path.name.endswith(".dist-info")
    )
    imports = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    result = subprocess.run(
        [python, "-S", "-c", imports, *modules, "elmo_core.config"],
        env={"PYTHONPATH": f"{site}:{REPO}", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    return result.stderr.strip().splitlines()[-1] if result.returncode else ""


def _without_index() -> dict[str, str]:
    """The environment with pip kept off every index, as on the device."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return environment | {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}


def predict_first_contact(
    python: Path, tree: Path, work: Path, environment: dict[str, str]
) -> bool:
    """``first_contact_budget.py``'s prediction of the first-contact call's device time, with the
    kernels' compile times where ``triton_aot.py`` ran; True where it is over its limit."""
    site = work / "budget-site"  # the carried wheels, as the device installs them
    install = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    install += [
        "--no-compile",
        "--target",
        str(site),
        *map(str, (tree / CARRY).glob("wheels/*.whl")),
    ]
    subprocess.run(install, check=True, env=environment)
    budget = [str(python), "-m", "infra.device.first_contact_budget", "--carried", CARRY]
    if (work / "kernels.json").is_file():
        budget += ["--kernels", str(work / "kernels.json")]
    predicted = subprocess.run(
        budget,
        cwd=tree,
        env=environment | {"PYTHONPATH": f"{site}:{tree}"},
        capture_output=True,
        text=True,
    )
    verdict = "ok" if predicted.returncode == 0 else "FAILED: over its limit or a stage's box"
    print(f"{'first-contact':16} predicted device time {verdict}\n{predicted.stdout}", flush=True)
    print(predicted.stderr[-2000:], end="", flush=True)
    return predicted.returncode != 0


def archive(into: Path) -> None:
    """The tree as ``git archive`` gives it, uncommitted changes to tracked files included."""
    stash = subprocess.run(
        ["git", "stash", "create"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    tarball = subprocess.run(
        ["git", "archive", stash or "HEAD"], cwd=REPO, capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tarball, check=True)


def problems(part: str, log: str, out: Path, seconds: float, suite: str) -> list[str]:
    """What is wrong with a part's run, each named."""
    found = []
    files = [path for path in out.rglob("*") if path.is_file()]
    if len(files) > MAX_FILES:
        found.append(f"{len(files)} files in its OUT, over the {MAX_FILES} that come back")
    if seconds > BUDGET_SECONDS:
        found.append(f"{seconds:.0f} s, over its {BUDGET_SECONDS} s budget")
    for match in sorted(set(re.findall(r"ModuleNotFoundError: (No module named [^\n]*)", log))):
        found.append(f"an import the device lacks: {match}")
    if "is not on the expected device" in log or "Expected all tensors to be on the same" in log:
        found.append("a device mismatch: a tensor off the model's device")
    if "overwritten by a subsequent run" in log:
        found.append("a graphed output read after the next replay")
    if part == "tests":
        found += _test_problems(out / "tests.xml", suite)
    elif not _ends_with_json(log):
        found.append("its last line is not JSON")
    return found


def suite_test_paths(suite: str) -> list[str]:
    """The test files and folders ``gpu_suite.sh``'s ``tests`` part runs."""
    return TEST_PATHS.findall(suite.split("tests)", 1)[1].split(";;", 1)[0])


def _test_problems(report: Path, suite: str) -> list[str]:
    if not report.is_file():
        return ["pytest wrote no report (it stopped before collecting)"]
    cases = ElementTree.parse(report).getroot().iter("testcase")
    # A module skipped whole (a package the device has and the rehearsal lacks) is one case
    # named after the module, with no class name.
    collected = [
        (case.get("classname") or case.get("name") or "").replace(".", "/") for case in cases
    ]
    found = []
    for path in suite_test_paths(suite):
        stem = path.removesuffix(".py")
        if not any(name.endswith(stem) or f"{stem}/" in f"{name}/" for name in collected):
            found.append(f"{path} collected no test")
    return found


def _ends_with_json(log: str) -> bool:
    lines = log.strip().splitlines()
    try:
        return isinstance(json.loads(lines[-1]), dict) if lines else False
    except json.JSONDecodeError:
        return False


def device_commands(timings: dict[str, float]) -> str:
    """What to pass to the device's ``run``, per part, with the rehearsal's time for each."""
    lines = [
        "Here, once before the device calls (the wheels for the device's Python;",
        f"{CARRY} is git-ignored and travels only where carry names it):",
        f"  .venv/bin/python -m infra.device.device_env fetch {CARRY}",
        f"  .venv/bin/python -m infra.device.device_env baseline REF... {CARRY}   # for ab: the"
        " trees before each change, oldest first",
        "Then one device call per part (PTB for recipe: copy ../shared/data/ptb to shared/data):",
    ]
    for part, seconds in timings.items():
        command = f"bash infra/device/gpu_suite.sh --carried {CARRY} $OUT {part}"
        limit = FIRST_CONTACT_TIMEOUT_S if part == "first-contact" else 600
        call = json.dumps({"command": command, "carry": [CARRY], "timeout_s": limit})
        lines.append(f"  run {call}   # rehearsal: {seconds:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "elmo-platform"
        / "rehearsal",
    )
    args = parser.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    tools = toolchain()
    print(f"rehearsal: Python {tools.version}, {tools.torch[-1]}", flush=True)
    if tools.stand_in:
        print(f"STAND-IN: {tools.stand_in}", flush=True)
    home = build(tools, args.cache.resolve())
    python = home / "venv/bin/python"
    work = Path(tempfile.mkdtemp(prefix="elmo-rehearsal-"))
    tree = work / "tree"
    archive(tree)
    shutil.copytree(home / "carried", tree / CARRY)
    baselines(["HEAD"], tree / CARRY)  # the ab part's: here the last commit against the tree
    suite = (tree / "infra/device/gpu_suite.sh").read_text()
    failed = False
    if tools.stand_in:
        problem = check_device_wheels(home / "device-wheels", work)
        failed = bool(problem) and not problem.startswith("not checked")
        verdict = f"FAILED: {problem}" if failed else problem or "ok"
        print(f"{'device wheels':16} Python {DEVICE_PYTHON}: {verdict}", flush=True)
    environment = _without_index() | {"PYTHON": str(python)}
    environment["PATH"] = f"{python.parent}:{environment['PATH']}"
    environment.pop("PYTHONPATH", None)
    if not tools.stand_in:  # the device's torch brings its triton, and with it ptxas
        kernels = subprocess.run(
            [str(python), "-m", "infra.device.triton_aot"],
            cwd=tree,
            env=environment | {"PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
        )
        verdict = "ok" if kernels.returncode == 0 else "FAILED: a compile error or a spill"
        print(
            f"{'triton sm_90':16} {verdict}\n{kernels.stdout}{kernels.stderr[-2000:]}", flush=True
        )
        failed = failed or kernels.returncode != 0
        (work / "kernels.json").write_text(kernels.stdout)
    failed = predict_first_contact(python, tree, work, environment) or failed
    timings = {}
    for part in parts:
        out = work / "out" / part
        start = time.perf_counter()
        run = subprocess.run(
            ["bash", "infra/device/gpu_suite.sh", "--carried", CARRY, "--rehearse", str(out), part],
            cwd=tree,
            env=environment,
            capture_output=True,
            text=True,
        )
        timings[part] = seconds = time.perf_counter() - start
        log = run.stdout + run.stderr
        found = problems(part, log, out, seconds, suite)
        if run.returncode != 0:
            found.insert(0, f"exit status {run.returncode}")
        print(
            f"{part:16} {seconds:6.0f} s  {'FAILED: ' + '; '.join(found) if found else 'ok'}",
            flush=True,
        )
        if found:
            failed = True
            print("  " + "\n  ".join(log.strip().splitlines()[-25:]))
    print(device_commands(timings))
    if failed:
        print(f"rehearsal FAILED (logs in {work / 'out'})")
        return 1
    shutil.rmtree(work)
    print("rehearsal passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
