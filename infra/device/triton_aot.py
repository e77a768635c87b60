"""The fused LSTM's Triton kernels compiled for the H100 (sm_90) ahead of time, on any machine.

Triton carries its own ptxas, so a machine with no GPU compiles exactly what the device would:
each kernel of ``elmo_core.model.lstm.triton_kernels`` for every GEMM dtype the fused layer hands it
(``GEMM_DTYPES``; the cells and carried state in float32, ``STATE_DTYPES``), with the block sizes
and warps it launches with. Each compile's registers and spills (ptxas' own account) and shared
memory are printed; a compile error or a spill fails it. Needs triton (the device's torch has it).

    python -m infra.device.triton_aot

Last line: one JSON object, a row per compiled kernel.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TARGET = ("cuda", 90, 32)  # the H100: compute capability 9.0, warps of 32
TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# Each kernel's pointers by what they hold: the GEMMs' dtype ("gemm"), the cells and state's
# ("state"), the step's mask (bool). The backward reads the gates in their dtype and writes
# float32 gradients.
POINTERS = {
    "_cell_kernel": {
        "gates": "gemm",
        "hidden": "gemm",
        "keep": "*i1",
        **dict.fromkeys(("c_prev", "cell", "tanh_cell", "c_next"), "state"),
    },
    "_projection_kernel": {
        "projection": "gemm",
        "output": "gemm",
        "keep": "*i1",
        **dict.fromkeys(("h_prev", "h_next"), "state"),
    },
    "_cell_grad_kernel": {
        "gates": "gemm",
        "keep": "*i1",
        **dict.fromkeys(("c_prev", "tanh_cell", "cell"), "state"),
        **dict.fromkeys(("d_hidden", "d_c", "d_gates"), "*fp32"),
    },
}
SCALARS = {"clip": "fp32"}  # every other argument a stride or size: i32
PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def signature(kernel: object, pointers: dict[str, str], gemm: torch.dtype) -> dict[str, str]:
    """Triton's signature of ``kernel`` for GEMMs in ``gemm`` and float32 state."""
    state = TRITON_TYPES[torch.float32]
    named = {"gemm": f"*{TRITON_TYPES[gemm]}", "state": f"*{state}"}
    result = {}
    for name in inspect.signature(kernel.fn).parameters:  # type: ignore[attr-defined]
        if name.startswith("BLOCK_"):
            result[name] = "constexpr"
        elif name in pointers:
            result[name] = named.get(pointers[name], pointers[name])
        else:
            result[name] = SCALARS.get(name, "i32")
    return result


def resources(ptx: str, ptxas: Path) -> dict[str, int]:
    """Registers and spill bytes, as ptxas reports them for sm_90a (what Triton's PTX for
    capability 9.0 targets)."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "kernel.ptx"
        source.write_text(ptx)
        report = subprocess.run(
            [
                str(ptxas),
                f"-arch=sm_{TARGET[1]}a",
                "-v",
                str(source),
                "-o",
                str(Path(scratch) / "k.cubin"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    registers, spills = PTXAS_REGISTERS.search(report), PTXAS_SPILLS.search(report)
    assert registers is not None, report
    return {
        "registers": int(registers[1]),
        "spill_store_bytes": int(spills[1]) if spills else 0,
        "spill_load_bytes": int(spills[2]) if spills else 0,
    }


def main() -> int:
    # A cache of its own: each kernel compiles from scratch, as on the device, and is timed so.
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-aot-")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvidia
    from triton.compiler import ASTSource

    from elmo_core.model.lstm import triton_kernels as lstm_triton

    ptxas = Path(nvidia.get_ptxas(TARGET[1]).path)
    constants = {"BLOCK_ROWS": lstm_triton.BLOCK_ROWS, "BLOCK_COLS": lstm_triton.BLOCK_COLS}
    rows, failed = [], False
    print(f"{'kernel':20} {'gemm':6} {'regs':>5} {'spills':>7} {'smem':>6} {'s':>5}")
    for name, pointers in POINTERS.items():
        kernel = getattr(lstm_triton, name)
        for gemm in lstm_triton.GEMM_DTYPES:
            started = time.perf_counter()
            row: dict[str, object] = {"kernel": name, "gemm": TRITON_TYPES[gemm]}
            try:
                source = ASTSource(kernel, signature(kernel, pointers, gemm), constexprs=constants)
                options = {"num_warps": lstm_triton.NUM_WARPS}
                compiled = triton.compile(source, target=GPUTarget(*TARGET), options=options)
                row |= resources(compiled.asm["ptx"], ptxas)
                row["shared_bytes"] = compiled.metadata.shared
                row["cubin_bytes"] = len(compiled.asm["cubin"])
            except Exception as error:  # a compile error is the finding: name it and go on
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            row["seconds"] = round(time.perf_counter() - started, 2)
            spilled = row.get("spill_store_bytes", 0) or row.get("spill_load_bytes", 0)
            failed = failed or "error" in row or bool(spilled)
            print(
                f"{name:20} {row['gemm']:6} {row.get('registers', '-'):>5} "
                f"{row.get('spill_store_bytes', '-'):>7} {row.get('shared_bytes', '-'):>6} "
                f"{row['seconds']:5.1f}  {row.get('error', '')}",
                flush=True,
            )
            rows.append(row)
    print(json.dumps({"target": f"sm_{TARGET[1]}", "kernels": rows, "ok": not failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
