"""The Ray Train worker's entry point, run in this process without Ray."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pipelines.train import worker


def test_a_worker_takes_rays_threads_fewer_under_load(monkeypatch: pytest.MonkeyPatch) -> None:
    shares: list[int] = []
    ran: list[int] = []

    def threads_under_load(share: int) -> int:
        shares.append(share)
        return 1

    monkeypatch.setattr(worker, "threads_under_load", threads_under_load)
    monkeypatch.setattr(worker.WorkerConfig, "model_validate", staticmethod(lambda config: config))
    monkeypatch.setattr(worker.RayRuntime, "current", classmethod(lambda cls: None))
    monkeypatch.setattr(worker, "train_loop", lambda *args: ran.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    config: dict[str, Any] = {}
    try:
        worker.train_loop_per_worker(config)
    finally:
        torch.set_num_threads(before)
    assert shares == [2] and ran == [1]  # the loop runs with the cut count
