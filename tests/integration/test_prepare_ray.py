"""prepare with ``executor: ray`` on a real local Ray: the same dataset as the local processes,
and user errors raised inside Ray tasks surface as themselves."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from elmo_core.config import PrepareConfig
from elmo_core.errors import DataError
from pipelines.prepare.pool import RayTaskPool
from pipelines.prepare.stage import prepare_files

pytestmark = pytest.mark.integration


def _corpus(root: Path, num_train: int = 4) -> SimpleNamespace:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)] + ["the", "a", "café", "東京"]
    files = {"train": [], "heldout": []}
    for split, count in (("train", num_train), ("heldout", 1)):
        for number in range(count):
            path = root / split / f"news.en.{split}-{number:05d}"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [" ".join(rng.choices(words, k=rng.randint(1, 15))) for _ in range(200)]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            files[split].append(path)
    return SimpleNamespace(source=str(root), **files)


def _config(**overrides) -> PrepareConfig:
    options = dict(format="1b-benchmark", sentences_per_shard=150, sentences_per_row_group=50)
    return PrepareConfig(**{**options, **overrides})


def test_ray_tasks_write_the_same_dataset_as_local_processes(ray_session, tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    local = prepare_files(_config(workers=2), corpus, str(tmp_path / "local")).manifest
    on_ray = prepare_files(_config(executor="ray"), corpus, str(tmp_path / "ray"))
    assert on_ray.manifest.splits == local.splits  # every shard's sha256
    assert on_ray.manifest.word_types == local.word_types
    assert on_ray.manifest.params.executor == "ray"
    again = prepare_files(_config(executor="ray"), corpus, str(tmp_path / "ray"))
    assert (again.num_shards_written, again.num_shards_skipped) == (0, on_ray.num_shards_written)


def test_a_data_error_inside_a_ray_task_names_the_file_and_line(ray_session, tmp_path):
    corpus = _corpus(tmp_path / "corpus", num_train=2)
    broken = corpus.train[1]
    broken.write_bytes(broken.read_bytes() + b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match=rf"{broken.name}:201: .*UTF-8"):
        prepare_files(_config(executor="ray", on_invalid_utf8="fail"), corpus, str(tmp_path / "o"))
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_path_a_ray_node_cannot_see_is_named_with_the_node(ray_session, tmp_path):
    with RayTaskPool(2) as pool, pytest.raises(DataError, match="not found on Ray node .*shared"):
        list(pool.imap(Path.read_bytes, [tmp_path / "only-on-another-node"]))
