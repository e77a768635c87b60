"""How prepare's processes are tuned: glibc keeps freed blocks for reuse."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Allocates and frees a 16 MB block (a block of text's temporary) 20 times; prints page faults.
_REALLOCATION_FAULTS = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from pipelines.prepare.tuning import keep_freed_memory
    tuned = sys.argv[1] == "tuned" and keep_freed_memory()
    np.ones(1 << 24, np.uint8)  # the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        np.ones(1 << 24, np.uint8)
    print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _REALLOCATION_FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_kept_memory_is_reused_instead_of_faulted_in_again() -> None:
    tuned, tuned_faults = _faults("tuned")
    _, default_faults = _faults("default")
    assert tuned == "True"
    # untuned: each 16 MB block is mapped afresh, faulting at least once; tuned: heap reused
    assert default_faults >= 20
    assert tuned_faults < default_faults / 10
