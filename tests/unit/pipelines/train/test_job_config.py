"""Training job config: preset → YAML → overrides, strict keys, run names, storage root."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elmo_core.errors import ConfigError
from elmo_core.presets import tiny
from pipelines.train.job_config import (
    TrainJobConfig,
    resolve_train_config,
    run_name,
    storage_root,
)


def test_a_preset_yaml_and_overrides_apply_in_that_order(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("train:\n  lr: 0.5\n  batch_size: 8\nrun:\n  num_workers: 4\n")
    cfg = resolve_train_config("tiny", config, ["train.batch_size=16", "run.grad_exchange=dense"])
    assert cfg.model == tiny()
    assert (cfg.train.lr, cfg.train.batch_size) == (0.5, 16)
    assert (cfg.run.num_workers, cfg.run.grad_exchange) == (4, "dense")


def test_without_a_model_option_the_model_is_the_original_elmo() -> None:
    cfg = resolve_train_config()
    assert (cfg.model.lstm.cell_dim, cfg.model.lstm.projection_dim) == (4096, 512)
    assert cfg.run == TrainJobConfig().run


def test_a_misspelt_run_key_names_its_dotted_path_and_source() -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_train_config("tiny", None, ["run.num_worker=2"])
    assert raised.value.key == "run.num_worker"
    assert "run.num_worker=2" in str(raised.value)


def test_an_ill_typed_choice_is_refused() -> None:
    with pytest.raises(ConfigError, match="run.grad_exchange"):
        resolve_train_config("tiny", None, ["run.grad_exchange=allreduce"])


def test_a_model_file_may_be_yaml_keys_or_our_model_config_json(tmp_path: Path) -> None:
    keys = tmp_path / "model.yaml"
    keys.write_text("lstm:\n  cell_dim: 64\n  projection_dim: 8\nnum_samples: 10\n")
    assert resolve_train_config(str(keys)).model.lstm.cell_dim == 64
    ours = tmp_path / "model_config.json"
    description = {"format_version": 1, "vocab_size": 9, "model": tiny().model_dump()}
    ours.write_text(json.dumps(description))
    assert resolve_train_config(str(ours)).model == tiny()


@pytest.mark.parametrize("model", ["huge", "missing.yaml"])
def test_an_unknown_preset_or_missing_model_file_is_a_config_error(model: str) -> None:
    with pytest.raises(ConfigError, match="tiny") as raised:
        resolve_train_config(model)
    assert raised.value.key == "model"


def test_run_names_hash_what_is_trained_but_not_where_it_runs() -> None:
    base = resolve_train_config("tiny")
    name = run_name(base, "a" * 64)
    assert re.fullmatch(r"bilm-[0-9a-f]{12}", name)
    assert run_name(base, "a" * 64) == name
    more_workers = resolve_train_config("tiny", None, ["run.num_workers=8"])
    assert run_name(more_workers, "a" * 64) == name
    same_recipe_on_gpus = ["run.use_gpu=true", "train.batch_size=128", "train.lr=0.2"]
    on_gpus = resolve_train_config("tiny", None, same_recipe_on_gpus)  # and the GPU's kernel
    assert on_gpus.model.lstm_impl != base.model.lstm_impl
    assert on_gpus.train.capture_step and on_gpus.train.shape_buckets  # and its captured step
    assert run_name(on_gpus, "a" * 64) == name
    assert run_name(base, "b" * 64) != name
    assert run_name(resolve_train_config("tiny", None, ["train.lr=0.1"]), "a" * 64) != name
    warn_later = ["train.warn_rise=2", "train.warn_parting=3"]  # what validation warns of
    assert run_name(resolve_train_config("tiny", None, warn_later), "a" * 64) == name
    reset = resolve_train_config("tiny", None, ["train.state_reset=0.2"])  # what is trained
    assert run_name(reset, "a" * 64) != name
    assert run_name(base, "a" * 64, init_from="/weights") != name
    named = resolve_train_config("tiny", None, ["run.name=my-run"])
    assert run_name(named, "a" * 64) == "my-run"


def test_storage_root_defaults_under_elmo_home_and_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert storage_root(resolve_train_config().run) == str(tmp_path / "home" / "runs")
    relative = resolve_train_config(None, None, ["run.storage_path=runs"]).run
    assert storage_root(relative) == str(tmp_path / "runs")
    remote = resolve_train_config(None, None, ["run.storage_path=s3://bucket/runs/"]).run
    assert storage_root(remote) == "s3://bucket/runs"


def test_a_gpu_run_defaults_to_the_graphed_batched_layer_and_the_larger_batch() -> None:
    cfg = resolve_train_config("original", None, ["run.use_gpu=true"])
    assert (cfg.model.lstm_impl, cfg.model.batch_directions) == ("graphed", True)
    assert (cfg.train.batch_size, cfg.train.lr) == (1024, pytest.approx(0.2 * 8**0.5, abs=1e-4))
    assert cfg.model.lstm.cell_dim == 4096  # the preset still applies above the defaults
    on_cpu = resolve_train_config("original")
    assert (on_cpu.model.lstm_impl, on_cpu.train.batch_size, on_cpu.train.lr) == ("auto", 128, 0.2)
    assert not on_cpu.train.capture_step


def test_one_gpu_worker_captures_its_step_and_several_do_not() -> None:
    one = resolve_train_config("original", None, ["run.use_gpu=true"])
    assert (one.train.capture_step, one.train.shape_buckets) == (True, True)
    several = resolve_train_config("original", None, ["run.use_gpu=true", "run.num_workers=2"])
    assert (several.train.capture_step, several.train.shape_buckets) == (False, False)
    no_buckets = ["run.use_gpu=true", "train.shape_buckets=false"]
    assert not resolve_train_config("original", None, no_buckets).train.capture_step
    eager = resolve_train_config("original", None, ["run.use_gpu=true", "train.capture_step=false"])
    assert (eager.train.capture_step, eager.train.shape_buckets) == (False, True)
    asked = ["run.use_gpu=true", "run.num_workers=2", "train.shape_buckets=true"]
    with pytest.raises(ConfigError, match="num_workers=1") as raised:  # asked for, several workers
        resolve_train_config("original", None, [*asked, "train.capture_step=true"])
    assert raised.value.key == "run"


def test_the_users_keys_win_over_the_gpu_defaults(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("train:\n  batch_size: 256\n")
    cfg = resolve_train_config(
        "tiny", config, ["run.use_gpu=true", "model.lstm_impl=compiled", "train.lr=0.3"]
    )
    assert (cfg.model.lstm_impl, cfg.model.batch_directions) == ("compiled", True)
    assert (cfg.train.batch_size, cfg.train.lr) == (256, 0.3)
