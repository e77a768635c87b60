"""A new user's first session, as typed: ``elmo prepare`` → ``elmo train`` → ``elmo evaluate`` in a
fresh directory with relative paths everywhere (the dataset, the run storage, the checkpoint).

Each command runs as its own process from that directory, as a shell would run it; training
starts its own local Ray, whose workers run elsewhere, so every relative path must have been
made absolute in the driver.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ELMO = str(Path(sys.executable).with_name("elmo"))


def _elmo(cwd: Path, *args: str) -> str:
    env = {**os.environ, "ELMO_HOME": str(cwd / "home"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    for variable in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "ELMO_MLFLOW_PARENT_RUN_ID"):
        env.pop(variable, None)
    done = subprocess.run(
        [ELMO, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, f"elmo {' '.join(args)}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.timeout(700)  # 208 s on the emulated slow machine, beside the suite
def test_prepare_train_evaluate_with_relative_paths_from_a_fresh_directory(tmp_path) -> None:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(120)]
    sentences = [" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(600)]
    (tmp_path / "corpus.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")

    _elmo(
        tmp_path,
        "prepare",
        "--corpus",
        "corpus.txt",
        "--out",
        "data",
        "--format",
        "text",
        "--set",
        "heldout_fraction=0.1",
    )
    assert (tmp_path / "data" / "manifest.json").is_file()

    trained = _elmo(
        tmp_path, "train", "--data", "data", "--model", "tiny",
        "--set", "train.max_steps=6", "--set", "train.batch_size=4",
        "--set", "train.unroll_steps=5", "--set", "train.validate_every=3",
        "--set", "train.validation_sentences=10", "--set", "run.storage_path=runs",
        "--no-register",
    )  # fmt: skip
    match = re.search(r"(bilm-[0-9a-f]{12}) finished: 6/6 steps", trained)
    assert match, trained
    run = match.group(1)
    assert (tmp_path / "runs" / run / "model" / "model_config.json").is_file()

    scored = _elmo(tmp_path, "evaluate", "--checkpoint", f"runs/{run}", "--data", "data")
    assert re.search(r"heldout perplexity \d+\.\d+", scored), scored
