"""The machines our times are given for: this one as it is, and the slower kind users and CI get.

The slow kind is a 2-vCPU cloud VM on an AMD EPYC with AVX2 and no AVX-512, where `mini` trained
at about 2.0k tokens/s on two threads. Holding PyTorch to AVX2 kernels alone does not make an
AVX-512 machine that slow (benchmarks/results/slow_machine-2026-11-29.md): its two vCPUs are one
core's two hyperthreads, and MKL takes its SSE code path on a CPU that is not Intel's. So the
emulation runs everything on one core, with ATen and oneDNN held to AVX2 and MKL to SSE4.2.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence

SLOW_ENV: Mapping[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    # its own compiled kernels: torch.compile's cache does not key on the capability, and loads
    # this machine's AVX-512 kernels as AVX2 ones, which compute garbage
    "TORCHINDUCTOR_CACHE_DIR": os.path.join(tempfile.gettempdir(), "torchinductor-slow"),
}
SLOW_PREFIX: Sequence[str] = ("taskset", "-c", "0")  # one core for every process

MACHINES = {
    "this": "this machine as it is",
    "slow": "a 2-vCPU AVX2 VM, emulated: one core, ATen and oneDNN at AVX2, MKL at SSE4.2",
}


def on_machine(
    machine: str, command: Sequence[str], env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``command`` and ``env`` as they run on ``machine`` (one of :data:`MACHINES`)."""
    if machine == "this":
        return list(command), dict(env)
    if machine == "slow":
        return [*SLOW_PREFIX, *command], {**env, **SLOW_ENV}
    raise ValueError(f"unknown machine {machine!r}: one of {', '.join(MACHINES)}")
