"""What the GPU suite finds on the device machine and what it must carry there.

The device image (Python 3.12, torch with CUDA, no package index) provides the heavy libraries in
``IMAGE``; everything else the suite imports travels as wheels. That list is not typed by hand: it
is the closure of ``ROOTS``' requirements (markers evaluated for Linux and the device's Python),
less the image's, each at the version ``constraints.txt`` pins. The rehearsal installs exactly
these; ``guard`` runs a CPU process that sees only what the device would have.

    python -m infra.device.device_env wheels                 # name==version, one a line
    python -m infra.device.device_env fetch .device          # the cp312 wheels to carry
    python -m infra.device.device_env baseline REF... .device   # the trees for the `ab` part
    python -m infra.device.device_env guard -m pytest ...    # python seeing only those packages
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints.txt"
DEVICE_PYTHON = "3.12"
# On the image, read there (KINDS.md): torch 2.11.0 (+cu130), numpy 2.5.2, triton 3.6.0; pyarrow and
# h5py present.
IMAGE = ("torch", "numpy", "pyarrow", "h5py", "triton")
# What the suite imports besides the image's: elmo_core's configs, tokenizer, CLI and readers,
# the benchmarks' corpus preparation, and the test runner.
ROOTS = ("pydantic", "pyyaml", "sacremoses", "typer", "tqdm", "fsspec", "pytest", "pytest-timeout")
# The tree itself travels (on PYTHONPATH), not as a wheel.
TREE = "elmo-platform"
BASELINE_PATHS = ("elmo_core", "pipelines", "benchmarks", "infra")  # what gpu_bilm.py imports
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def pinned_versions(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``constraints.txt`` as {canonical name: version}."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            versions[canonicalize_name(name)] = version.strip()
    return versions


def requirement_closure(roots: Iterable[str], python: str = DEVICE_PYTHON) -> set[str]:
    """Every distribution ``roots`` need on Linux under ``python``, read from installed metadata."""
    environment = {key: str(value) for key, value in default_environment().items()}
    environment.update(python_version=python, python_full_version=python, extra="")
    environment.update(sys_platform="linux", platform_system="Linux")
    seen: set[str] = set()
    pending = [canonicalize_name(root) for root in roots]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                pending.append(canonicalize_name(requirement.name))
    return seen


def carried_wheels(python: str = DEVICE_PYTHON) -> list[str]:
    """``name==version`` of every wheel the device needs and its image lacks."""
    image = {canonicalize_name(name) for name in IMAGE}
    versions = pinned_versions()
    needed = sorted(requirement_closure(ROOTS, python) - image)
    missing = [name for name in needed if name not in versions]
    if missing:
        raise SystemExit(f"{CONSTRAINTS}: no pinned version for {', '.join(missing)}")
    return [f"{name}=={versions[name]}" for name in needed]


def download(specs: Sequence[str], into: Path, python: str) -> None:
    """Binary wheels of ``specs`` for Linux x86-64 and ``python``, their needs not resolved."""
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    subprocess.run([*command, *platforms, "-d", str(into), *specs], check=True)


def fetch(into: Path, python: str = DEVICE_PYTHON) -> None:
    """``into/wheels``: the carried wheels for ``python``, for a device with no package index."""
    wheels = into / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    download(carried_wheels(python), wheels, python)


def baselines(refs: Sequence[str], into: Path) -> list[Path]:
    """``into/baseline-K``: the tree at each git ref in turn (what ``gpu_bilm.py`` runs from), its
    commit in ``COMMIT``, for the suite's ``ab`` part to time each against the next and the last
    against this tree's; earlier ones removed."""
    for old in into.glob("baseline-*"):
        shutil.rmtree(old)
    return [baseline(ref, into / f"baseline-{k}") for k, ref in enumerate(refs, start=1)]


def baseline(ref: str, target: Path) -> Path:
    """``target``: the tree at git ``ref``, its commit in ``target/COMMIT``."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, *BASELINE_PATHS], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    (target / "COMMIT").write_text(commit + "\n")
    return target


def allowed_distributions() -> set[str]:
    """What a process on the device can import: the image (with what it needs), the carried
    wheels and the tree."""
    carried = {spec.split("==")[0] for spec in carried_wheels()}
    return requirement_closure(IMAGE) | carried | {TREE}


def device_view(into: Path, allowed: set[str]) -> Path:
    """``into``, a site directory of links to the ``allowed`` distributions' files (their
    metadata too) in this environment: on ``PYTHONPATH`` with ``python -S``, a process finds
    those and nothing else installed, as on the device."""
    for dist in importlib.metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in allowed - {TREE}:
            continue
        for top in {file.parts[0] for file in dist.files or [] if file.parts[0] != ".."}:
            source, link = Path(str(dist.locate_file(top))), into / top
            if source.exists() and not link.exists() and not top.endswith(".pth"):
                link.symlink_to(source)
    return into


def guard(argv: Sequence[str], allowed: set[str] | None = None) -> None:
    """Run ``python ARGV`` (a script or ``-m MODULE``) seeing only the device's packages and
    the tree; a missing one fails as ``No module named …``."""
    view = device_view(
        Path(tempfile.mkdtemp(prefix="device-site-")), allowed or allowed_distributions()
    )
    path = [str(view), str(REPO), os.environ.get("PYTHONPATH", "")]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    os.execve(sys.executable, [sys.executable, "-S", *argv], environment)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["guard"]:
        guard(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    wheels = commands.add_parser("wheels", help="the carried wheels, name==version")
    wheels.add_argument("--python", default=DEVICE_PYTHON)
    fetched = commands.add_parser("fetch", help="download what the device needs into DIR")
    fetched.add_argument("into", type=Path)
    fetched.add_argument("--python", default=DEVICE_PYTHON)
    earlier = commands.add_parser("baseline", help="each git REF's tree into DIR/baseline-K")
    earlier.add_argument("refs", nargs="+")
    earlier.add_argument("into", type=Path)
    commands.add_parser("guard", help="-m MODULE ARGS...: run with the device's imports only")
    args = parser.parse_args(argv)
    if args.command == "wheels":
        print("\n".join(carried_wheels(args.python)))
    elif args.command == "baseline":
        baselines(args.refs, args.into)
    else:
        fetch(args.into, args.python)


if __name__ == "__main__":
    main()
