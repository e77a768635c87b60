"""The pool prepare's tasks run in: start method, results, in-process with one worker; and how its
processes are tuned: glibc keeps freed blocks for reuse."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from pipelines.prepare.pool import LocalTaskPool, _start_method


def test_a_process_with_threads_gets_the_forkserver() -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert _start_method().get_start_method() == "forkserver"
    finally:
        release.set()
        thread.join()


def test_a_single_threaded_process_forks() -> None:
    code = "from pipelines.prepare.pool import _start_method as m; print(m().get_start_method())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fork"


@pytest.mark.parametrize("other_thread", [False, True], ids=["alone", "beside-a-thread"])
def test_two_workers_return_every_result(other_thread: bool) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    if other_thread:
        thread.start()
    try:
        with LocalTaskPool(2) as pool:
            pending = pool.submit(abs, -7)
            assert sorted(pool.imap(abs, [-3, -1, -2, 5])) == [1, 2, 3, 5]
            assert pending.get() == 7
    finally:
        release.set()
        if other_thread:
            thread.join()


def test_one_worker_runs_a_submitted_task_in_process_at_once() -> None:
    ran = []
    with LocalTaskPool(1) as pool:
        pending = pool.submit(ran.append, "now")
        assert ran == ["now"] and pending.get() is None


def test_one_worker_runs_tasks_on_threads_and_an_error_drops_those_not_started() -> None:
    with LocalTaskPool(1) as pool:
        assert sorted(pool.imap(abs, [-3, -1, -2, 5])) == [1, 2, 3, 5]
    started = []

    def fail_first(task: int) -> int:
        started.append(task)
        if task == 0:
            raise ValueError("the first task fails")
        time.sleep(0.05)
        return task

    with LocalTaskPool(1) as pool, pytest.raises(ValueError, match="first task"):
        list(pool.imap(fail_first, list(range(40))))
    assert len(started) < 40


# Allocates and frees a 16 MB block (a block of text's temporary) 20 times; prints page faults.
_REALLOCATION_FAULTS = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    from pipelines.prepare.pool import keep_freed_memory
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
