"""The train stage on a real local Ray (2 CPUs): DDP workers, a killed worker, exact resumption.

A 2-worker run in which rank 1 kills its own process once (Ray Train restarts the group from the
last checkpoint), its batches from loader processes the Ray actors fork, checked for its curves,
its MLflow record and its outputs; and a 1-worker run stopped by Ctrl-C and resumed by the same
command. How sentences are dealt to ranks is test_reader.py's.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import manifest_sha256
from elmo_core.errors import ConfigError, DataError
from elmo_core.model.serialization import read_bilm_dir
from pipelines.cli import train_main as main
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files
from pipelines.tracking import stage_runs
from pipelines.tracking.flow_runs import TRAIN_LOSS_METRIC
from pipelines.train.job_config import resolve_train_config, run_name
from pipelines.train.run_directory import FINISHED_FILE
from pipelines.train.stage import FAIL_ONCE_ENV, train

pytestmark = pytest.mark.integration

NUM_WORDS = 150  # a vocabulary above the tiny preset's 64 sampled candidates
# ``python -m pipelines.train`` with Ctrl-C's default handling, as in a terminal's foreground job:
# a test runner started in the background by a shell ignores SIGINT, and its children inherit that.
AS_FOREGROUND_JOB = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('pipelines.train', run_name='__main__', alter_sys=True)"
)
SMALL_RUN = [
    "train.batch_size=4",
    "train.unroll_steps=5",
    "train.log_every=4",
    "train.validation_sentences=20",
]


def _sentences(rng: random.Random, count: int) -> list[str]:
    """Learnable text: each sentence walks the word list in steps of 3 from a random start."""
    lines = []
    for _ in range(count):
        start, length = rng.randrange(NUM_WORDS), rng.randint(3, 10)
        lines.append(" ".join(f"w{(start + 3 * k) % NUM_WORDS}" for k in range(length)))
    return lines


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """4 training shards and small heldout row groups, so both ranks get data of each split."""
    root = tmp_path_factory.mktemp("train-corpus")
    rng = random.Random(0)
    (root / "train.txt").write_text("\n".join(_sentences(rng, 400)) + "\n")
    (root / "heldout.txt").write_text("\n".join(_sentences(rng, 40)) + "\n")
    corpus = CorpusFiles(str(root), "text", [root / "train.txt"], [root / "heldout.txt"])
    cfg = PrepareConfig(format="text", sentences_per_shard=100, sentences_per_row_group=10)
    prepare_files(cfg, corpus, str(root / "dataset"))
    return str(root / "dataset")


@pytest.mark.timeout(1100)  # 326-355 s on the emulated slow machine, beside the suite
def test_two_workers_survive_a_killed_worker_and_record_the_run(
    ray_session, store, dataset, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv(FAIL_ONCE_ENV, f"1:12:{tmp_path / 'killed'}")
    overrides = [
        *SMALL_RUN,
        "train.max_steps=24",
        "train.checkpoint_every=8",
        "train.validate_every=8",
        "run.num_workers=2",
        "run.data_workers=2",  # each worker's batches from two loader processes, as on a GPU
        "run.max_failures=1",
        f"run.storage_path={tmp_path / 'runs'}",
    ]
    cfg = resolve_train_config("tiny", None, overrides)
    with stage_runs.stage_run("pretrain", run_name="flow") as parent:
        parent_id = parent.info.run_id
    result = train(cfg, dataset, parent_run_id=parent_id, tags={"elmo.flow": "test"})

    assert (tmp_path / "killed").exists()  # rank 1 did die once
    assert result.resumed_from_step == 8 and result.steps == result.total_steps == 24
    run_dir = Path(result.run_dir)
    assert json.loads((run_dir / FINISHED_FILE).read_text())["steps"] == 24
    assert read_bilm_dir(result.model_dir).vocab_size > NUM_WORDS
    assert result.best_model_dir is not None and read_bilm_dir(result.best_model_dir)

    validation = store.get_metric_history(result.mlflow_run_id, "bilm/validation/perplexity")
    by_step = {m.step: m.value for m in validation}
    assert sorted(by_step) == [8, 16, 24] and by_step[24] < by_step[8]  # the loss falls
    assert result.best_perplexity == pytest.approx(min(by_step.values()))
    for part in ("softmax", "dense"):  # what each worker's exchanges sent, as counted
        sent = store.get_metric_history(result.mlflow_run_id, f"bilm/train/exchanged_bytes_{part}")
        assert sent and all(metric.value > 0 for metric in sent)
    # one number, in the description: no single-dot chart of it
    assert not store.get_metric_history(result.mlflow_run_id, "bilm/validation/best_perplexity")

    run = store.get_run(result.mlflow_run_id)
    assert run.info.run_name == f"train-{result.run_name}"  # <stage>-<subject>
    description = run.data.tags[stage_runs.DESCRIPTION_TAG]  # what it did and left
    assert description.startswith(f"{result.summary()}. best model (step ")
    assert f"`{result.best_model_dir}`; final model (step 24) `{result.model_dir}`" in description
    # The driver samples system metrics from the start, before Ray and the workers are up.
    system = store.get_metric_history(result.mlflow_run_id, "system/cpu_utilization_percentage")
    assert len(system) >= 3 and min(m.timestamp for m in system) < min(
        m.timestamp for m in store.get_metric_history(result.mlflow_run_id, TRAIN_LOSS_METRIC)
    )
    per_node = [key for key in run.data.metrics if key.startswith("system/") and key.count("/") > 1]
    assert not per_node  # one machine: the workers leave its metrics to the driver
    assert "None" not in run.data.params.values() and "init_from" not in run.data.params
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.data.tags[stage_runs.STAGE_TAG] == "train" and run.data.tags["elmo.flow"] == "test"
    assert run.data.params["train.max_steps"] == "24"
    assert run.data.params["run.num_workers"] == "2"
    assert len(run.data.params["dataset.manifest_sha256"]) == 64
    assert "git_commit" in run.data.params
    assert {
        "bilm/train/sampled_loss",
        "bilm/train/sampled_loss_forward",
        "bilm/train/sampled_loss_backward",
        "bilm/train/tokens_per_s",
        "bilm/train/grad_norm",
        "bilm/validation/perplexity_forward",
        "bilm/validation/perplexity_backward",
    } <= set(run.data.metrics)
    assert "bilm/train/lr" not in run.data.metrics  # constant: a param, not a flat chart
    artifacts = {a.path for a in store.list_artifacts(result.mlflow_run_id)}
    artifacts |= {a.path for a in store.list_artifacts(result.mlflow_run_id, "curves")}
    assert {
        "config.json",
        "train_result.json",
        "curves/train_sampled_loss.png",
        "curves/validation_perplexity.png",
    } <= artifacts

    # The same command again from the CLI: recognised as finished, then evaluated and registered.
    args = ["--data", dataset, "--model", "tiny"]
    for override in overrides:
        args += ["--set", override]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"{result.run_name} already finished" in printed and "registered models:/" in printed
    assert main(args) == 0  # and again: one training run is one model version
    assert "already registered as models:/elmo-bilm/1" in capsys.readouterr().out
    versions = store.search_model_versions("name = 'elmo-bilm'")
    assert [v.tags["elmo.train_run_id"] for v in versions] == [result.mlflow_run_id]
    # The training run is the version's source run, and its page lists the model it became.
    assert [v.run_id for v in versions] == [result.mlflow_run_id]
    trained = store.get_run(result.mlflow_run_id)
    logged = versions[0].source.removeprefix("models:/")
    assert [o.model_id for o in trained.outputs.model_outputs] == [logged]
    assert trained.info.status == "FINISHED"


def test_a_user_error_in_a_worker_is_raised_once_as_itself_and_the_run_failed(
    ray_session, store, dataset, tmp_path, capsys
) -> None:
    corrupt = tmp_path / "dataset"
    shutil.copytree(dataset, corrupt)
    for shard in (corrupt / "train").glob("*.parquet"):  # same size: only the checksum tells
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    cfg = resolve_train_config(
        "tiny",
        None,
        [*SMALL_RUN, "train.max_steps=4", "run.max_failures=3", f"run.storage_path={tmp_path}"],
    )
    with pytest.raises(DataError, match="checksum does not match") as raised:
        train(cfg, str(corrupt))
    assert raised.value.path is not None and raised.value.path.startswith(str(corrupt / "train"))
    assert "restarting" not in capsys.readouterr().out  # not retried: it would fail again
    name = stage_runs.stage_run_name("train", run_name(cfg, manifest_sha256(str(corrupt))))
    failed = stage_runs.find_run(name, "train")
    assert failed is not None and failed.info.status == "FAILED"


def test_workers_that_ask_for_more_cpus_than_the_ray_has_are_refused_before_a_run_starts(
    ray_session, store, dataset, tmp_path
) -> None:
    """The module's Ray has 2 CPUs: 2 workers of 2 would wait for them for ever."""
    overrides = [*SMALL_RUN, "train.max_steps=4", f"run.storage_path={tmp_path}"]
    cfg = resolve_train_config(
        "tiny", None, [*overrides, "run.num_workers=2", "run.cpus_per_worker=2"]
    )
    name = stage_runs.stage_run_name("train", run_name(cfg, manifest_sha256(dataset)))
    earlier = stage_runs.find_run(name, "train")  # another test's run of the same name, if any
    with pytest.raises(ConfigError, match=r"2 worker\(s\) × 2 CPUs is more than the 2 CPUs") as err:
        train(cfg, dataset)
    assert err.value.key == "run.cpus_per_worker"
    newest = stage_runs.find_run(name, "train")
    assert (newest and newest.info.run_id) == (earlier and earlier.info.run_id)  # none started


@pytest.mark.timeout(900)  # 274 s on the emulated slow machine, beside the suite
def test_ctrl_c_stops_the_run_killed_and_the_same_command_resumes_it(
    ray_session, store, dataset, tmp_path
) -> None:
    """Stopped by Ctrl-C, then resumed by the same call from its newest complete checkpoint, in
    its own MLflow run. That a resumed run equals a straight one weight for weight is
    test_worker_loop.py's (the same loop, in one process) and test_lost_node.py's (on Ray); the
    restart limit is test_supervision.py's."""
    args = ["--data", dataset, "--model", "tiny", "--no-register"]
    overrides = [
        *SMALL_RUN,
        "train.max_steps=60",
        "train.checkpoint_every=5",
        "train.validate_every=50",
        "run.checkpoints_to_keep=2",
        f"run.storage_path={tmp_path / 'runs'}",
    ]
    for override in overrides:
        args += ["--set", override]
    env = {**os.environ, "MLFLOW_TRACKING_URI": stage_runs.use_tracking(), "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-c", AS_FOREGROUND_JOB, *args],  # python -m pipelines.train
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    # Rank 0 commits a checkpoint before its next step: once it reports a step past step 5, the
    # checkpoint of step 5 is complete. Reading blocks until then (the timeout guards a hang).
    assert driver.stdout is not None
    printed = []
    for line in driver.stdout:
        printed.append(line)
        reported = re.search(r"\[train\] step (\d+)/", line)
        if reported and int(reported[1]) > 5:
            break
    else:
        pytest.fail(f"the run ended before step 6: {driver.communicate()}")
    assert list((tmp_path / "runs").glob("*/checkpoints/*/COMPLETE"))
    os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    out, err = driver.communicate(timeout=120)

    assert driver.returncode == 130, err[-3000:]
    # python -m pipelines.train's console as clean as the flow's: no Ray worker prefixes or
    # colour codes, no MLflow INFO lines, no word of Ray's token authentication
    console = "".join(printed) + out + err
    for noise in ("\x1b[", "pid=", "INFO mlflow", "Token authentication"):
        assert noise not in console, noise
    stopped = re.search(r"interrupted: (bilm-\w+) stopped; the same command resumes it from its "
                        r"checkpoint at step (\d+):\n  (.*)", err)  # fmt: skip
    assert stopped, err[-3000:]
    assert stopped.group(3) == shlex.join(["python", "-m", "pipelines.train", *args])
    name, step = stopped.group(1), int(stopped.group(2))
    killed = stage_runs.find_run(f"train-{name}", "train")
    assert killed is not None and killed.info.status == "KILLED"

    resumed = train(resolve_train_config("tiny", None, overrides), dataset)  # on the module's Ray
    assert resumed.run_name == name and resumed.resumed_from_step >= step > 0
    assert resumed.steps == 60
    assert resumed.mlflow_run_id == killed.info.run_id
    assert store.get_run(resumed.mlflow_run_id).info.status == "FINISHED"
    kept = sorted(path.name for path in (tmp_path / "runs" / name / "checkpoints").iterdir())
    assert kept == ["step_000055", "step_000060"]
