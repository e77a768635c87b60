"""Fixtures shared across test packages: tiny prepared datasets made by the real prepare stage."""

from __future__ import annotations

import os

# MLflow 3 starts a telemetry client on import; tests never reach the network.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from elmo_core.config import PrepareConfig
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files

MakeDataset = Callable[..., str]

# Tests use tiny tensors: one intra-op thread avoids oversubscribing CI's two cores (the Ray
# workers and servers some tests start run beside the test process).
torch.set_num_threads(1)


@pytest.fixture
def make_dataset(tmp_path: Path) -> MakeDataset:
    """``make_dataset(train_lines, heldout={"file.txt": lines}, **prepare_keys) -> dataset dir``.

    Lines are whitespace-tokenized sentences. Heldout files keep their sentences in source order
    (training shards are shuffled by prepare). Each call writes a new dataset under ``tmp_path``.
    """
    calls = iter(range(1_000))

    def make(
        train: Sequence[str],
        heldout: dict[str, Sequence[str]] | None = None,
        **prepare_keys: Any,
    ) -> str:
        root = tmp_path / f"corpus-{next(calls)}"
        root.mkdir()
        train_file = root / "train.txt"
        train_file.write_text("".join(f"{line}\n" for line in train), encoding="utf-8")
        heldout_files = []
        for name, lines in (heldout or {}).items():
            path = root / name
            path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            heldout_files.append(path)
        cfg = PrepareConfig(format="text", **prepare_keys)
        corpus = CorpusFiles(str(root), "text", [train_file], heldout_files)
        out = root.parent / f"{root.name}-dataset"
        prepare_files(cfg, corpus, str(out))
        return str(out)

    return make
