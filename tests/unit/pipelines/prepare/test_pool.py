"""The pool prepare's tasks run in: start method, results, in-process with one worker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from pipelines.prepare.pool import WorkerPool, _start_method


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
        with WorkerPool(2) as pool:
            pending = pool.submit(abs, -7)
            assert sorted(pool.imap(abs, [-3, -1, -2, 5])) == [1, 2, 3, 5]
            assert pending.get() == 7
    finally:
        release.set()
        if other_thread:
            thread.join()


def test_one_worker_runs_a_submitted_task_in_process_at_once() -> None:
    ran = []
    with WorkerPool(1) as pool:
        pending = pool.submit(ran.append, "now")
        assert ran == ["now"] and pending.get() is None


def test_one_worker_runs_tasks_on_threads_and_an_error_drops_those_not_started() -> None:
    with WorkerPool(1) as pool:
        assert sorted(pool.imap(abs, [-3, -1, -2, 5])) == [1, 2, 3, 5]
    started = []

    def fail_first(task: int) -> int:
        started.append(task)
        if task == 0:
            raise ValueError("the first task fails")
        time.sleep(0.05)
        return task

    with WorkerPool(1) as pool, pytest.raises(ValueError, match="first task"):
        list(pool.imap(fail_first, list(range(40))))
    assert len(started) < 40
