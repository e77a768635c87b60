"""The train driver's checks: every mistake a user can make in the data, the storage or the
starting weights fails in the driver, in seconds, before Ray starts, naming the path or key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elmo_core.config import LSTMConfig
from elmo_core.errors import ConfigError, DataError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from pipelines.train.job_config import resolve_train_config
from pipelines.train.preflight import plan_training

SENTENCES = [f"w{i % 97} w{(3 * i) % 89} w{i % 5} end" for i in range(120)]  # > 64 types


@pytest.fixture
def dataset(make_dataset) -> str:
    return make_dataset(SENTENCES, {"held.txt": SENTENCES[:4]})


def _config(*overrides: str):
    return resolve_train_config("tiny", None, list(overrides))


def test_a_relative_dataset_and_storage_are_made_absolute(dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(dataset).parent)
    plan = plan_training(_config("run.storage_path=runs"), Path(dataset).name)
    assert plan.data == dataset
    assert plan.run_dir.url == f"{Path(dataset).parent}/runs/{plan.name}"


def test_a_directory_without_a_manifest_is_named(tmp_path):
    with pytest.raises(DataError, match="not a prepared dataset") as raised:
        plan_training(_config(), str(tmp_path))
    assert raised.value.path == f"{tmp_path}/manifest.json"


def test_a_missing_shard_says_to_re_run_prepare(dataset):
    shard = next((Path(dataset) / "train").glob("*.parquet"))
    shard.unlink()
    with pytest.raises(DataError, match="re-run prepare") as raised:
        plan_training(_config(), dataset)
    assert raised.value.path == str(shard)


def test_more_workers_than_sentences_is_refused_with_what_to_do(make_dataset):
    tiny_data = make_dataset(["only one sentence"], {"held.txt": ["a b"]})
    with pytest.raises(DataError, match=r"fewer than the 2 workers.*run\.num_workers"):
        plan_training(_config("run.num_workers=2"), tiny_data)


def test_more_sampled_candidates_than_words_names_the_key(make_dataset):
    small_vocab = make_dataset(["a b c d"] * 10, {"held.txt": ["a b"]})
    with pytest.raises(ConfigError, match="vocabulary") as raised:
        plan_training(_config(), small_vocab)
    assert raised.value.key == "model.num_samples"


def test_init_from_a_missing_path_is_named(dataset, tmp_path):
    with pytest.raises(WeightsError, match="no such checkpoint directory") as raised:
        plan_training(_config(), dataset, init_from=str(tmp_path / "nowhere"))
    assert raised.value.path == str(tmp_path / "nowhere")


def test_init_from_weights_of_another_shape_fail_in_the_driver(dataset, tmp_path):
    wider = tiny().model_copy(update={"lstm": LSTMConfig(cell_dim=48, projection_dim=16)})
    write_bilm_dir(BiLM(wider, 200), tmp_path / "wider")
    with pytest.raises(WeightsError, match="do not fit"):
        plan_training(_config(), dataset, init_from=str(tmp_path / "wider"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_storage_path_that_cannot_be_written_names_the_key(dataset, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="cannot create the run directory") as raised:
        plan_training(_config(f"run.storage_path={locked / 'runs'}"), dataset)
    assert raised.value.key == "run.storage_path"


def test_the_checks_never_start_ray(dataset, monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("plan_training started Ray")

    monkeypatch.setattr(ray, "init", refuse)
    plan_training(_config(), dataset)
