"""What the platform prints on a console: progress of long work, and no chatter from the libraries.

Where tqdm draws nothing (a log file, a Prefect worker, a Ray job) progress is one line at a steady
interval. Chatter is silenced by each library's own environment switch, never filtered as text.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO

from tqdm import tqdm

INTERVAL_ENV = "ELMO_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 10.0


class ProgressBar(Protocol):
    """What the work advances: ``update(n)`` as ``n`` more units are done."""

    def update(self, n: float = 1) -> bool | None: ...


class TimedLines:
    """A progress line every ``interval`` seconds, from a thread, so it ticks while the work
    waits; a last line on close if any was printed."""

    def __init__(
        self,
        total: float | None,
        desc: str,
        *,
        initial: float = 0,
        unit: str = "B",
        interval: float = DEFAULT_INTERVAL_S,
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.stream = stream or sys.stderr
        self.n, self._initial = initial, initial
        self._started = time.monotonic()
        self._lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"progress-{desc}", daemon=True)
        self._ticker.start()

    def update(self, n: float = 1) -> None:
        with self._lock:
            self.n += n

    def close(self) -> None:
        self._stop.set()
        self._ticker.join()
        if self._lines:
            self._print()

    def line(self) -> str:
        """The current figures as one line (tqdm's own formatting of sizes, rate and ETA)."""
        elapsed = time.monotonic() - self._started
        with self._lock:
            done = self.n
        rate = (done - self._initial) / elapsed if elapsed > 0 else None
        figures = "{percentage:3.0f}% {n_fmt}/{total_fmt}" if self.total else "{n_fmt}"
        times = "{elapsed}<{remaining}" if self.total else "{elapsed}"
        layout = f"{{desc}}: {figures} {{unit}} [{times}, {{rate_fmt}}]"
        return tqdm.format_meter(
            done,
            self.total,
            elapsed,
            prefix=self.desc,
            unit=self.unit,
            unit_scale=self.unit == "B",
            unit_divisor=1024,
            rate=rate,
            bar_format=layout,
        )

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._print()

    def _print(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self._lines += 1


def progress_interval() -> float:
    """Seconds between progress lines off a terminal (``ELMO_PROGRESS_INTERVAL_S``)."""
    return float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))


@contextmanager
def console_progress(
    total: float | None,
    desc: str,
    *,
    initial: float = 0,
    unit: str = "B",
    enabled: bool = True,
) -> Iterator[ProgressBar]:
    """A bar for ``total`` units of work (bytes by default): tqdm on a terminal, timed lines
    elsewhere, nothing when not ``enabled``."""
    if not enabled or sys.stderr.isatty():
        with tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024,
            disable=not enabled,
            leave=False,
        ) as bar:
            yield bar
        return
    lines = TimedLines(total, desc, initial=initial, unit=unit, interval=progress_interval())
    try:
        yield lines
    finally:
        lines.close()


QUIET_ENVIRONMENT = {
    # Ray Train logs a worker's print and prints it too (Ray wraps sys.stdout): every line twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # Its watcher logs a core_worker error as it starts; train restarts failed workers itself.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    # Our workers' lines say what they are ("[train] step …"); Ray's name/pid prefix adds colour.
    "RAY_DISABLE_WORKER_LOG_PREFIX": "1",
    # Else a worker's root logger is at INFO (each report's record, matplotlib's font cache);
    # warnings and errors reach stderr through show_warnings (no JSON logs for the Train view).
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    # Ray's own INFO lines ("Setting up process group"), read as a local Ray's processes start.
    "RAY_LOGGER_LEVEL": "warning",
    # A progress bar per artifact download and INFO on routine steps; read at `import mlflow`.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def show_warnings() -> None:
    """Every logger's warnings and errors on stderr, in a process whose root logger has no
    handler (a Ray worker, with Train's structured logging off above). Python's fallback does not
    cover a library that gave its logger a ``NullHandler``: urllib3 does, and its retries are how
    a run says that MLflow went away and came back."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def quiet_environment() -> None:
    """Set each of :data:`QUIET_ENVIRONMENT` in this process, unless the user already set it."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
