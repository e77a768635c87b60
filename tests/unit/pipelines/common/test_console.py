"""console_progress: timed lines off a terminal, silence for short work, tqdm's figures; and
show_warnings, which lets a library's warnings out of a Ray worker."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import pytest

from pipelines.common.console import INTERVAL_ENV, TimedLines, console_progress


def test_off_a_terminal_a_line_comes_at_each_interval_while_the_work_waits(capsys, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    with console_progress(4 * 1024**2, "[prepare] count") as bar:
        bar.update(1024**2)
        time.sleep(0.3)  # one file still being read: no update, yet lines keep coming
        bar.update(3 * 1024**2)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3
    assert all(line.startswith("[prepare] count: ") for line in lines)
    assert re.match(r"\[prepare\] count:  25% 1\.00M/4\.00M B \[", lines[0]), lines[0]
    assert re.match(r"\[prepare\] count: 100% 4\.00M/4\.00M B \[", lines[-1]), lines[-1]


def test_work_shorter_than_one_interval_prints_nothing(capsys, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "60")
    with console_progress(10, "[prepare] shuffle", unit="shard") as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""


def test_a_disabled_bar_prints_nothing(capsys, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.01")
    with console_progress(10, "download x", enabled=False) as bar:
        bar.update(5)
        time.sleep(0.05)
    assert capsys.readouterr().err == ""


def test_a_line_has_the_rate_and_eta_and_an_unknown_total_just_the_count() -> None:
    known = TimedLines(100, "shuffle", unit="shard", interval=3600, stream=io.StringIO())
    time.sleep(0.05)
    known.update(25)
    line = known.line()
    known.close()
    assert re.fullmatch(r"shuffle:  25% 25/100 shard \[00:00<00:0\d, [\d.]+shard/s\]", line), line
    unknown = TimedLines(None, "download", initial=2048, interval=3600, stream=io.StringIO())
    unknown.update(2048)
    line = unknown.line()
    unknown.close()
    assert re.fullmatch(r"download: 4\.00k B \[00:00, [\d.]+[kM]?B/s\]", line), line


# A process as a Ray worker starts: a root logger with no handler, urllib3 imported (it gives its
# logger a NullHandler, so Python's last-resort handler never prints its retries).
RETRY_WARNING = """
import logging, urllib3
from pipelines.common.console import show_warnings
{call}
logging.getLogger("urllib3.connectionpool").warning("Retrying after connection refused")
"""


@pytest.mark.parametrize("shown", [False, True])
def test_show_warnings_puts_a_library_retry_on_stderr(shown: bool) -> None:
    script = RETRY_WARNING.format(call="show_warnings()" if shown else "")
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert ("Retrying after connection refused" in done.stderr) is shown
