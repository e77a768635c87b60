"""A process's torch threads: its share of the cores, fewer while the machine is oversubscribed."""

from __future__ import annotations

import pytest
import torch

from elmo_core import threads


@pytest.mark.parametrize(
    ("cpus", "load", "share", "expected"),
    [
        (2, 0.1, 2, 2),  # idle: the whole share
        (2, 1.6, 2, 2),  # busy, not oversubscribed: still the share
        (2, 2.0, 2, 2),  # as many runnable as cores: the cores' share of them
        (2, 7.0, 2, 1),  # far oversubscribed: never fewer than one
        (16, 32.0, 8, 4),
    ],
)
def test_threads_are_cut_only_while_the_cores_are_oversubscribed(
    monkeypatch: pytest.MonkeyPatch, cpus: int, load: float, share: int, expected: int
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))

    assert threads.threads_under_load(share) == expected


def test_a_block_runs_with_fewer_threads_under_load_and_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (7.0, 7.0, 7.0))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.fewer_threads_under_load() as inside:
            assert inside == torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
