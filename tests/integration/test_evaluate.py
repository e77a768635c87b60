"""The evaluate stage end to end: checkpoint resolution, MLflow records, CLI, Ray tasks."""

from __future__ import annotations

import re
from pathlib import Path

import mlflow
import pytest
import torch

from elmo_core.config import PrepareConfig
from elmo_core.data.manifest import manifest_sha256
from elmo_core.data.reader import load_manifest
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import find_model_dir, read_bilm_dir, write_bilm_dir
from elmo_core.perplexity import evaluate_perplexity
from elmo_core.presets import tiny
from pipelines.common.handoff import TrainResult
from pipelines.evaluate.cli import main
from pipelines.evaluate.result import EvaluationResult
from pipelines.evaluate.stage import PERPLEXITY_TABLE, evaluate_bilm, evaluate_trained, heldout_hash
from pipelines.prepare.corpus_sources import CorpusFiles
from pipelines.prepare.stage import prepare_files
from pipelines.tracking import stage_runs

pytestmark = pytest.mark.integration

TRAIN = [f"w{i % 7} w{i % 5} the " + " ".join(["x"] * (i % 4)) for i in range(30)]
HELDOUT = [f"w{i % 6} the zzz " + " ".join(["x"] * (i % 3)) for i in range(13)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Heldout in row groups of 3 sentences, so two ranks both get data."""
    root = tmp_path_factory.mktemp("evaluate")
    (root / "train.txt").write_text("\n".join(TRAIN) + "\n")
    (root / "held-a.txt").write_text("\n".join(HELDOUT[:7]) + "\n")
    (root / "held-b.txt").write_text("\n".join(HELDOUT[7:]) + "\n")
    corpus = CorpusFiles(
        str(root), "text", [root / "train.txt"], [root / "held-a.txt", root / "held-b.txt"]
    )
    cfg = PrepareConfig(format="text", sentences_per_row_group=3)
    prepare_files(cfg, corpus, str(root / "dataset"))
    return str(root / "dataset")


def _model(dataset: str, seed: int) -> BiLM:
    torch.manual_seed(seed)
    config = tiny().model_copy(update={"num_samples": 4})
    return BiLM(config, load_manifest(dataset).vocab.size)


@pytest.fixture(scope="module")
def model_dir(dataset, tmp_path_factory) -> Path:
    return write_bilm_dir(_model(dataset, 0), tmp_path_factory.mktemp("model") / "bilm")


def _direct(model: Path, dataset: str, **kwargs):
    return evaluate_perplexity(read_bilm_dir(model), dataset, progress=False, **kwargs)


def test_evaluate_a_model_directory_logs_metrics_and_params(store, dataset, model_dir):
    result = evaluate_bilm(str(model_dir), dataset)
    expected = _direct(model_dir, dataset)
    assert result.perplexity == pytest.approx(expected.perplexity)
    assert result.forward_perplexity == pytest.approx(expected.forward_perplexity)
    predicted = sum(len(sentence.split()) + 1 for sentence in HELDOUT)  # each token and </S>
    assert result.num_tokens == expected.num_tokens == predicted
    assert result.heldout_hash == heldout_hash(dataset, "heldout", None)
    run = store.get_run(result.run_id)
    assert run.data.metrics["heldout_perplexity"] == pytest.approx(result.perplexity)
    names = {"heldout_perplexity_forward", "heldout_perplexity_backward"}
    assert names <= set(run.data.metrics)
    # What was predicted: each heldout word and each sentence's end (prepare counts the words).
    heldout = load_manifest(dataset).split("heldout")
    predicted = heldout.num_tokens + heldout.num_sentences
    assert run.data.metrics["heldout_predicted_tokens"] == result.num_tokens == predicted
    assert "heldout_tokens" not in run.data.metrics
    # An untrained model's state does not lock up; the count is logged all the same.
    assert (result.forward_trapped, result.backward_trapped) == (0, 0)
    assert result.num_rows == expected.num_rows == 128  # the batched protocol's rows
    assert run.data.metrics["heldout_trapped_rows_forward"] == 0
    assert run.data.metrics["heldout_trapped_rows_backward"] == 0
    assert run.info.run_name == f"evaluate-{model_dir.name}"  # named after what it evaluates
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert "None" not in run.data.params.values()  # no files or batch size given: none logged
    assert not {"files", "batch_size"} & set(run.data.params)
    (dataset_input,) = run.inputs.dataset_inputs  # MLflow's Datasets panel: the manifest's hash
    assert dataset_input.dataset.digest == manifest_sha256(dataset)[:36]
    assert dataset_input.dataset.name == "dataset"
    assert run.data.params["checkpoint"] == str(model_dir)
    assert run.data.params["protocol"] == "batched"
    assert run.data.tags[stage_runs.STAGE_TAG] == "evaluate"
    # Its page says what it measured, and holds the perplexities as a table.
    description = run.data.tags[stage_runs.DESCRIPTION_TAG]
    assert description == f"{model_dir}: {result.summary()}, batched protocol"
    table = mlflow.load_table(PERPLEXITY_TABLE, run_ids=[result.run_id])
    assert list(table["direction"]) == ["forward", "backward", "mean (geometric)"]
    assert list(table["perplexity"]) == [round(result.forward_perplexity, 2)] + [
        round(value, 2) for value in (result.backward_perplexity, result.perplexity)
    ]


def test_selected_files_change_the_heldout_hash_and_the_count(store, dataset, model_dir):
    some = evaluate_bilm(
        str(model_dir), dataset, files=["held-b"], protocol="original", batch_size=2
    )
    everything = evaluate_bilm(str(model_dir), dataset)
    assert some.heldout_hash != everything.heldout_hash
    assert 0 < some.num_tokens < everything.num_tokens
    assert some.files == ["held-b"] and some.protocol == "original"


def test_a_run_directory_resolves_to_its_latest_checkpoint(store, dataset, tmp_path):
    run_dir = tmp_path / "run"
    early, late = _model(dataset, 1), _model(dataset, 2)
    checkpoints = run_dir / "checkpoints"
    write_bilm_dir(early, checkpoints / "step_000002" / "model")
    write_bilm_dir(late, checkpoints / "step_000010" / "model")
    (run_dir / "LATEST").write_text("checkpoints/step_000010\n")
    assert find_model_dir(run_dir) == checkpoints / "step_000010" / "model"
    result = evaluate_bilm(str(run_dir), dataset)
    expected = _direct(checkpoints / "step_000010" / "model", dataset)
    assert result.perplexity == pytest.approx(expected.perplexity)
    (run_dir / "LATEST").write_text("checkpoints/step_000002\n")
    assert find_model_dir(run_dir) == checkpoints / "step_000002" / "model"
    assert find_model_dir(checkpoints / "step_000010") == checkpoints / "step_000010" / "model"


def test_an_mlflow_run_uri_is_downloaded_and_evaluated(store, dataset, model_dir):
    with stage_runs.stage_run("train", run_name="fake-train") as run:
        mlflow.log_artifacts(str(model_dir), artifact_path="bilm")
    result = evaluate_bilm(f"runs:/{run.info.run_id}", dataset)
    assert result.perplexity == pytest.approx(_direct(model_dir, dataset).perplexity)


def test_command_line_prints_the_perplexities(store, dataset, model_dir, capsys):
    status = main(
        [
            "--checkpoint",
            str(model_dir),
            "--data",
            dataset,
            "--protocol",
            "original",
            "--batch-size",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert re.search(
        r"heldout perplexity [\d.]+ \(forward [\d.]+, backward [\d.]+\) on every heldout token",
        out,
    )


def test_command_line_names_the_rows_whose_state_locked_up(store, dataset, tmp_path, capsys):
    # Every gate open and every candidate +1: each row's cells climb to the clip in 3 tokens.
    model = _model(dataset, 0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lstm" in name and name.endswith("bias"):
                parameter.fill_(20.0)
    locked = write_bilm_dir(model, tmp_path / "locked")
    output = tmp_path / "evaluation.json"
    status = main(
        [
            "--checkpoint",
            str(locked),
            "--data",
            dataset,
            "--batch-size",
            "2",
            "--output",
            str(output),
        ]
    )
    assert status == 0
    assert (
        capsys.readouterr()
        .out.rstrip()
        .endswith(
            "batched protocol); forward: 2 of 2 rows locked up (cells at the clip); "
            "backward: 2 of 2 rows locked up (cells at the clip)"
        )
    )
    result = EvaluationResult.read(output)
    assert (result.forward_trapped, result.backward_trapped, result.num_rows) == (2, 2, 2)
    metrics = store.get_run(result.run_id).data.metrics
    assert metrics["heldout_trapped_rows_forward"] == metrics["heldout_trapped_rows_backward"] == 2


def test_command_line_reports_a_missing_checkpoint_in_one_line(store, dataset, tmp_path, capsys):
    status = main(["--checkpoint", str(tmp_path / "nothing"), "--data", dataset])
    assert status == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_two_ray_tasks_equal_the_in_process_ranks(ray_session, store, dataset, model_dir):
    result = evaluate_bilm(str(model_dir), dataset, workers=2, batch_size=2)
    parts = [_direct(model_dir, dataset, rank=r, world_size=2, batch_size=2) for r in range(2)]
    assert parts[0].num_tokens > 0 and parts[1].num_tokens > 0
    total = parts[0] + parts[1]
    assert result.num_tokens == total.num_tokens
    assert result.forward_perplexity == pytest.approx(total.forward_perplexity, rel=1e-6)
    assert result.backward_perplexity == pytest.approx(total.backward_perplexity, rel=1e-6)


def test_a_training_runs_model_scored_once_is_not_scored_again(store, dataset, model_dir):
    trained = TrainResult(
        run_name="bilm-test",
        run_dir=str(model_dir.parent),
        model_dir=str(model_dir),
        best_model_dir=None,
        mlflow_run_id="0" * 32,
        steps=10,
        total_steps=10,
        resumed_from_step=0,
        best_perplexity=None,
        stopped_early=False,
        seconds=1.0,
    )

    def evaluate_runs() -> int:
        found = mlflow.search_runs(
            filter_string="tags.`elmo.stage` = 'evaluate'", output_format="list"
        )
        return len(found)

    before = evaluate_runs()
    first = evaluate_trained(trained, dataset, hand_on="final")
    again = evaluate_trained(trained, dataset, hand_on="final")
    other = evaluate_trained(trained.model_copy(update={"mlflow_run_id": "1" * 32}), dataset)

    assert again == first  # the same run's result, read back
    assert other.run_id != first.run_id  # another training run's model is scored
    assert evaluate_runs() == before + 2
