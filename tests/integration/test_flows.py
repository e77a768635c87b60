"""The flows against a real Prefect API (a temporary server), a real SQLite MLflow and a real Ray.

One module-wide ELMo home and Prefect server; the pretrain flow runs twice on a tiny corpus of
its own (the second run must reuse the cached dataset, the finished training, the registered
version and the finished adaptation), the prepare task alone shows the cache and its
invalidation, the analyze flow's rerun reuses its finished analysis, and bad input fails early
with messages that name the field or the address. ``make run`` (``python -m flows.run_local``)
runs once in a subprocess on a fresh home, for its console: what a user reads.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import torch
from mlflow.tracking import MlflowClient
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
    LogFilterTaskRunId,
)
from prefect.logging.handlers import APILogWorker
from prefect.testing.utilities import prefect_test_harness

from elmo_core.data.manifest import manifest_sha256
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from flows.analyze import analyze
from flows.artifacts import AnalyzeSummary, PretrainSummary
from flows.following import TRAINING_PROGRESS_KEY, progress_key
from flows.params import AnalyzeParams, DataParams, PretrainParams
from flows.pretrain import pretrain
from flows.run_local import REPO
from flows.tasks import TASK_SCORES_FIGURE, prepare
from pipelines.common.services import ServiceUnreachable
from pipelines.common.settings import mlflow_tracking_uri
from pipelines.tracking.stage_runs import TRAINING_VIEW

# the pretrain flow's two runs: 158 s on the emulated slow machine, beside the suite
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# More word types than the tiny preset's 64 sampled-softmax candidates.
WORDS = [f"word{index}" for index in range(120)]
TRAINING = {
    "model": "tiny",
    "mode": "local",
    "overrides": [
        "train.max_steps=8",
        "train.batch_size=4",
        "train.log_every=4",
        "train.checkpoint_every=4",
        "train.validate_every=4",
        "train.validation_sentences=10",
    ],
}


@pytest.fixture(scope="module")
def home(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ELMO_HOME, the embedded MLflow store and a temporary Prefect server for the module."""
    root = tmp_path_factory.mktemp("flows")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ELMO_HOME", str(root / "home"))
        for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
            patch.delenv(name, raising=False)
        with prefect_test_harness(server_startup_timeout=180):
            yield root / "home"


@pytest.fixture(scope="module")
def corpus(home: Path) -> str:
    rng = random.Random(0)
    path = home.parent / "corpus.txt"
    lines = (" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) for _ in range(400))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _data(corpus: str) -> dict[str, Any]:
    return {"corpus": corpus, "prepare": ["heldout_fraction=0.1"]}


def _write_tagging(root: Path, num_train: int) -> str:
    """A task of ``Name went to Place .`` sentences (B-PER / B-LOC), 1 epoch: ``num_train`` to
    train on, 6 to score."""
    names, places = ["Anna", "Bob", "Carla"], ["Rome", "Oslo", "Lima"]
    sentences = [
        f"{names[i % 3]} B-PER\nwent O\nto O\n{places[i // 3 % 3]} B-LOC\n. O\n"
        for i in range(num_train + 6)
    ]
    root.mkdir(parents=True, exist_ok=True)
    (root / "tags.train").write_text("\n".join(sentences[:num_train]))
    (root / "tags.dev").write_text("\n".join(sentences[num_train:]))
    (root / "tags.yaml").write_text(
        "name: tagger\ntype: tagging\nformat: conll2003\ntrain: tags.train\ndev: tags.dev\n"
        "test: tags.dev\nreader: {tag_scheme: iob2}\nhead: {hidden_dim: 8}\n"
        "training: {epochs: 1, batch_size: 32, lr: 0.01, patience: null}\n"
    )
    return str(root / "tags.yaml")


def _children(client: MlflowClient, parent_run_id: str) -> dict[str, Any]:
    """The parent's child runs by stage."""
    experiment = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    return {run.data.tags["elmo.stage"]: run for run in runs}


def _artifacts(flow_run_id: UUID) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {artifact.key: artifact for artifact in artifacts}


def _log_messages(flow_run_id: UUID) -> list[str]:
    """Every log line of a flow run, page by page (the API returns at most 200 lines a call)."""
    messages: list[str] = []
    with get_client(sync_client=True) as client:
        while page := client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
            offset=len(messages),
        ):
            messages += [log.message for log in page]
    return messages


def _task_log_messages(flow_run_id: UUID, task: str) -> list[str]:
    """The log lines of one task run of a flow run, as its own page in Prefect's UI shows them."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        (run,) = [run for run in runs if run.name.split("-", 1)[0] == task]
        logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id])))
    return [log.message for log in logs]


def _task_states(flow_run_id: UUID) -> dict[str, str]:
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {run.name.split("-", 1)[0]: run.state.name for run in runs if run.state}


def _task_run_names(flow_run_id: UUID) -> set[str]:
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {run.name for run in runs}


@flow
def prepare_only(data: DataParams) -> str:
    return prepare(data)


def test_prepare_is_cached_across_runs_and_runs_again_once_its_dataset_is_gone(
    home: Path, corpus: str
) -> None:
    data = DataParams(corpus=corpus, prepare=["heldout_fraction=0.1", "seed=7"])

    states = []
    for _ in range(2):
        state = prepare_only(data, return_state=True)
        states.append(_task_states(state.state_details.flow_run_id)["prepare"])
    dataset = state.result()
    shutil.rmtree(dataset)
    state = prepare_only(data, return_state=True)
    states.append(_task_states(state.state_details.flow_run_id)["prepare"])
    again = prepare_only(data, return_state=True)
    states.append(_task_states(again.state_details.flow_run_id)["prepare"])

    assert states == ["Completed", "Cached", "Completed", "Cached"]
    assert (Path(dataset) / "manifest.json").is_file()
    assert Path(dataset).parent == home / "datasets"


@pytest.fixture(scope="module")
def two_runs(home: Path, corpus: str) -> list[tuple[PretrainSummary, UUID]]:
    params = PretrainParams.model_validate(
        {
            "data": _data(corpus),
            "training": TRAINING,
            "tasks": [str(REPO / "examples/tasks/ner.yaml")],
        }
    )
    runs = []
    for _ in range(2):
        state = pretrain(params, return_state=True)
        APILogWorker.drain_all(timeout=30)  # its log lines reach the server before we read them
        runs.append((state.result(), state.state_details.flow_run_id))
    return runs


def test_pretrain_runs_every_stage_and_registers_the_champion_and_a_task_model(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    summary, flow_run_id = two_runs[0]
    client = MlflowClient(mlflow_tracking_uri())

    assert _task_states(flow_run_id) == {
        name: "Completed"
        for name in ("prepare", "train", "evaluate", "register", "adapt", "summarize")
    }
    assert not summary.already_trained and summary.champion
    assert int(client.get_model_version_by_alias("elmo-bilm", "champion").version) == 1
    assert summary.model_uri == "models:/elmo-bilm/1"
    assert summary.task_models == ["models:/elmo-ner/1"]


def test_each_flow_run_has_one_parent_mlflow_run_with_every_stage_as_its_child(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    summary, flow_run_id = two_runs[0]
    client = MlflowClient(mlflow_tracking_uri())
    parent = client.get_run(summary.parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary.parent_run_id}'",
    )

    assert parent.data.tags["prefect.flow_run_id"] == str(flow_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["training.model"] == "tiny"
    stages = sorted(run.data.tags["elmo.stage"] for run in children)
    assert stages == ["adapt", "evaluate", "prepare", "register", "train"]
    assert all(run.data.tags["prefect.flow_run_id"] == str(flow_run_id) for run in children)
    handed_on = [run for run in children if run.data.tags["elmo.stage"] in ("evaluate", "register")]
    assert {run.data.tags["elmo.bilm_checkpoint"] for run in handed_on} == {"best"}  # by default


def test_the_parent_run_is_the_flow_runs_summary(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    summary, _ = two_runs[0]
    client = MlflowClient(mlflow_tracking_uri())
    parent = client.get_run(summary.parent_run_id)

    assert parent.info.run_name.startswith("pretrain-corpus.txt-tiny-")  # <stage>-<subject>
    assert parent.data.metrics["heldout_perplexity"] == pytest.approx(summary.perplexity)
    task_metrics = sorted(key for key in parent.data.metrics if key.startswith("ner/"))
    assert task_metrics == [  # as the UI orders them: the means, then the deviations
        "ner/test_f1_mean_baseline",
        "ner/test_f1_mean_elmo",
        "ner/test_f1_mean_gain",
        "ner/test_f1_sd_baseline",
        "ner/test_f1_sd_elmo",
    ]
    artifacts = {item.path for item in client.list_artifacts(summary.parent_run_id)}
    assert {"summary.md", "dataset.json", TASK_SCORES_FIGURE} <= artifacts
    description = parent.data.tags["mlflow.note.content"]
    assert "heldout perplexity" in description and "workflowType=machine_learning" in description
    # Inside the MLflow UI: relative links to every stage's run, by name; no word of serving it.
    # The one absolute link is the Prefect flow run's: another server's page.
    assert "](#/experiments/" in description and description.count("http") == 1
    assert re.search(r"^- Prefect flow run \[[\w-]+\]\(http[^)]+/flow-run/", description, re.M)
    assert "mlflow ui" not in description
    for stage in ("prepare", "train", "evaluate", "register", "adapt ner"):
        assert re.search(
            rf"^- {stage}: \[{stage.split()[0]}-[^\]]+\]\(#/experiments/", description, re.M
        )


def test_the_runs_that_read_the_dataset_record_it_as_their_mlflow_input(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    summary, _ = two_runs[0]
    client = MlflowClient(mlflow_tracking_uri())
    children = client.search_runs(
        [client.get_run(summary.parent_run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{summary.parent_run_id}'",
    )
    inputs = {
        run.data.tags["elmo.stage"]: run.inputs.dataset_inputs[0].dataset
        for run in children
        if run.data.tags["elmo.stage"] in ("prepare", "train", "evaluate")
    }
    assert len(inputs) == 3
    assert {dataset.digest for dataset in inputs.values()} == {
        manifest_sha256(summary.dataset)[:36]
    }
    assert {dataset.source_type for dataset in inputs.values()} == {"local"}


# A run's page in the MLflow UI (`mlflow ui` on the embedded store), as a bare URL: Prefect's UI
# shows log messages as plain text and links the URLs in them.
RUN_URL = r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/\w+\?workflowType=machine_learning$"


def test_the_flow_log_says_what_happens_in_domain_terms(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    _, flow_run_id = two_runs[0]
    text = "\n".join(_log_messages(flow_run_id))

    for expected in (
        rf"^the flow run's parent run in MLflow: {RUN_URL}",
        r"dataset train: [\d,]+ sentences, [\d,]+ tokens, OOV [\d.]+%$",
        r"vocabulary [\d,]+ words \(<S>, </S>, <UNK> included\) of the [\d,]+ word types in "
        r"train and heldout$",
        r"^train: biLM bilm-\w+, preset tiny, dataset corpus\.txt-\w+$",
        rf"^train run of biLM bilm-\w+ in MLflow: {RUN_URL}",
        r"train-bilm-\w+: step \d+/8  sampled loss [\d.]+  [\d,]+ tokens/s  grad norm [\d.]+  "
        r"ETA (\d+:\d\d:\d\d|\?)$",
        r"train-bilm-\w+: step \d+: validation perplexity [\d.]+ \(forward [\d.]+, backward "
        r"[\d.]+\) on a 10-sentence heldout sample",
        r"biLM bilm-\w+ trained: 8/8 steps",
        r"^evaluate: the best model \(step [48], validation perplexity [\d.]+\)$",
        r"heldout perplexity [\d.]+ \(forward [\d.]+, backward [\d.]+\)",
        rf"^evaluate run in MLflow: {RUN_URL}",
        r"registered models:/elmo-bilm/1, alias `@champion`: first champion: heldout perplexity "
        r"\d+(\.\d\d?)?$",
        rf"^register run in MLflow: {RUN_URL}",
        r"task ner: test f1 [\d.]+ ± [\d.]+ with ELMo, [\d.]+ ± [\d.]+ without \(mean ± sample "
        r"standard deviation over seeds 0, 1, 2; \d+ test examples\): gain [+-][\d.]+, .*\. "
        r"This version holds seed 0's weights \(test f1 [\d.]+\)",
        r"^adapt-ner: seed \d \(\d of 3\), (with ELMo|the baseline): epoch \d+ of at most \d+"
        r".*, ETA \d+:\d\d:\d\d$",
        r"^adapt-ner: seed \d \(3 of 3\), the baseline: .*; finished$",
        rf"^adapt run of task ner in MLflow: {RUN_URL}",
        rf"^the summary \(the parent run's description\) in MLflow: {RUN_URL}",
    ):
        assert re.search(expected, text, re.MULTILINE), expected
    assert "](" not in text and "shard" not in text  # no markdown links; no shard counts
    training = [line.split(" ", 2)[:2] for line in text.splitlines() if "bilm-" in line]
    # Named as it starts, linked while it trains (not once it is done), then its outcome.
    assert training[0] == ["train:", "biLM"] and training[1] == ["train", "run"]
    assert training[-1][0] == "biLM"


def test_a_rerun_reuses_the_cached_dataset_the_finished_training_and_adaptation_and_versions(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    (first, _), (second, flow_run_id) = two_runs

    states = _task_states(flow_run_id)
    assert states["prepare"] == "Cached"
    assert second.already_trained
    log = "\n".join(_log_messages(flow_run_id))
    assert re.search(rf"^train run of biLM bilm-\w+ in MLflow: {RUN_URL}", log, re.MULTILINE)
    assert (second.dataset, second.train_run, second.model_uri, second.task_models) == (
        first.dataset,
        first.train_run,
        first.model_uri,
        first.task_models,
    )
    assert second.parent_run_id != first.parent_run_id
    assert re.search(r"^task ner reused \(already adapted\): test f1 ", log, re.MULTILINE)


def test_the_run_publishes_tables_and_a_summary_linking_to_mlflow(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    summary, flow_run_id = two_runs[0]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    by_key = {artifact.key: artifact for artifact in artifacts}

    assert set(by_key) == {
        "dataset-statistics",
        "heldout-perplexity",
        "task-scores",
        "pretrain-summary",
        TRAINING_PROGRESS_KEY,
        progress_key("adapt"),
    }
    assert {artifact.type for artifact in artifacts} == {"table", "markdown", "progress"}
    created = {key: artifact.created for key, artifact in by_key.items()}
    assert created["dataset-statistics"] < created["heldout-perplexity"] < created["task-scores"]
    markdown = str(by_key["pretrain-summary"].data)
    assert "[pretrain-corpus.txt-tiny-" in markdown  # the parent run, by its name
    assert "mlflow ui --backend-store-uri sqlite:///" in markdown
    assert "?workflowType=machine_learning" in markdown
    assert "heldout perplexity" in markdown and "elmo-ner" in markdown
    (scores,) = json.loads(by_key["task-scores"].data)  # each score beside its split's size
    assert scores["task"] == "ner" and scores["examples"] > 0 and scores["seeds"] == 3


# --- analyze --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def analyze_params(home: Path) -> AnalyzeParams:
    """A tiny untrained biLM, a 12-sentence tagging task and the bundled sense set, two
    fractions, one seed."""
    torch.manual_seed(0)
    bilm = write_bilm_dir(BiLM(tiny(), 100), home.parent / "analyze-bilm")
    return AnalyzeParams(
        tasks=[_write_tagging(home.parent / "analyze-task", num_train=12)],
        bilm=str(bilm),
        senses_train=str(REPO / "examples/analysis/data/senses.train.tsv"),
        senses_test=str(REPO / "examples/analysis/data/senses.test.tsv"),
        fractions=[0.5, 1.0],
        seeds=[0],
    )


def _analyze_flow_run(params: AnalyzeParams) -> tuple[AnalyzeSummary, UUID]:
    state = analyze(params, return_state=True)
    APILogWorker.drain_all(timeout=30)  # the run's log lines reach the server before we read them
    assert state.state_details.flow_run_id is not None
    return state.result(), state.state_details.flow_run_id


@pytest.fixture(scope="module")
def analyzed(analyze_params: AnalyzeParams) -> tuple[AnalyzeSummary, UUID]:
    """The analyze flow on :func:`analyze_params`."""
    return _analyze_flow_run(analyze_params)


def test_the_analyze_flows_run_is_a_child_of_the_flow_runs_parent(
    analyzed: tuple[AnalyzeSummary, UUID],
) -> None:
    summary, flow_run_id = analyzed
    client = MlflowClient(mlflow_tracking_uri())
    parent = client.get_run(summary.parent_run_id)
    children = _children(client, summary.parent_run_id)

    assert _task_states(flow_run_id) == {"analyze": "Completed"}
    assert parent.info.run_name.startswith("analyze-") and parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"] == str(flow_run_id)
    assert list(children) == ["analyze"]
    run = children["analyze"]
    assert run.info.run_id == summary.run_id and run.info.status == "FINISHED"
    assert run.data.tags["prefect.flow_run_id"] == str(flow_run_id)
    assert "word_sense_nearest_centroid_accuracy_of_best_layer" in run.data.metrics
    assert re.match(r"tagger test_f1, elmo by train fraction +50% [\d.±]+  100% ", summary.table[0])


def test_the_analyze_flow_publishes_and_logs_the_table(
    analyzed: tuple[AnalyzeSummary, UUID],
) -> None:
    summary, flow_run_id = analyzed
    artifact = _artifacts(flow_run_id)["analysis"]
    messages = set(_log_messages(flow_run_id))

    assert artifact.type == "markdown"
    markdown = str(artifact.data)
    assert "| tagger linear probe accuracy | layer 0: " in markdown
    assert "| word sense, nearest centroid accuracy | layer 0: " in markdown
    assert "[analyze-" in markdown  # the runs, by name
    assert set(summary.table) <= messages
    # its progress as it went, run by run, in the analyze task's own log
    progress = [
        line
        for line in _task_log_messages(flow_run_id, "analyze")
        if re.match(r"analyze-\S+: tagger: run \d+/\d+, ", line)
    ]
    assert progress and progress[-1].startswith("analyze-")
    bar = _artifacts(flow_run_id)[progress_key("analyze")]
    assert bar.type == "progress" and float(bar.data) == 100.0
    assert re.fullmatch(r"analyzed tagger: \d+ rows", bar.description)


def test_a_second_analyze_flow_run_reuses_the_finished_analysis_and_says_so(
    analyzed: tuple[AnalyzeSummary, UUID], analyze_params: AnalyzeParams
) -> None:
    first, _ = analyzed
    summary, flow_run_id = _analyze_flow_run(analyze_params)

    assert (summary.run_id, summary.table) == (first.run_id, first.table)
    assert "analysis reused: a finished analyze run of this biLM and settings" in set(
        _log_messages(flow_run_id)
    )
    runs = [
        line
        for line in _task_log_messages(flow_run_id, "analyze")
        if re.match(r"analyze-\S+: \w+: run \d", line)
    ]
    assert runs == []  # no task model trained again


def test_pretrain_with_analyze_analyzes_the_new_biLM_in_its_flow_run(
    two_runs: list[tuple[PretrainSummary, UUID]], home: Path, corpus: str
) -> None:
    """A third run of the same pretraining (its dataset, training and version reused) with
    ``analyze``: the analysis of the registered biLM on its task and the bundled sense set is one
    more child of the parent. One seed and two fractions, for time."""
    params = PretrainParams.model_validate(
        {
            "data": _data(corpus),
            "training": TRAINING,
            "tasks": [_write_tagging(home.parent / "pretrain-task", num_train=20)],
            "analyze": True,
            "seeds": [0],
            "fractions": [0.5, 1.0],
        }
    )

    state = pretrain(params, return_state=True)
    summary, flow_run_id = state.result(), state.state_details.flow_run_id
    client = MlflowClient(mlflow_tracking_uri())
    children = _children(client, summary.parent_run_id)

    assert flow_run_id is not None and summary.analysis_run_id is not None
    assert summary.already_trained and summary.model_uri == two_runs[0][0].model_uri
    assert _task_states(flow_run_id)["analyze"] == "Completed"
    assert children["analyze"].info.run_id == summary.analysis_run_id
    assert children["analyze"].data.params["bilm"] == summary.model_uri
    assert "word_sense_nearest_centroid_accuracy_of_best_layer" in children["analyze"].data.metrics
    artifacts = _artifacts(flow_run_id)
    assert "analysis" in artifacts
    written = str(artifacts["pretrain-summary"].data)
    assert summary.analysis_run_id in written
    assert "## Analysis" in written and summary.analysis_headline[0] in written
    described = client.get_run(summary.parent_run_id).data.tags["mlflow.note.content"]
    version = summary.model_uri.removeprefix("models:/").replace("/", "/versions/")
    # a link inside the UI, in its model-training view
    assert f"[{summary.model_uri}](#/models/{version}{TRAINING_VIEW})" in described
    with get_client(sync_client=True) as prefect:
        flow_run_name = prefect.read_flow_run(flow_run_id).name
    assert f"Prefect flow run [{flow_run_name}](http" in described


def test_ill_typed_and_unknown_parameters_are_refused_with_the_field(home: Path) -> None:
    deployment_id = pretrain.to_deployment(name="params-check").apply()
    from prefect.deployments import run_deployment

    with pytest.raises(Exception, match=r"params.training.num_workers.*'four' is not of type"):
        run_deployment(
            deployment_id,
            parameters={"params": {"data": {"corpus": "c"}, "training": {"num_workers": "four"}}},
            timeout=0,
        )
    with pytest.raises(Exception, match=r"'num_workerz' was unexpected"):
        run_deployment(
            deployment_id,
            parameters={"params": {"data": {"corpus": "c"}, "training": {"num_workerz": 2}}},
            timeout=0,
        )
    misspelt = {"overrides": ["train.max_steps=5", "train.max_step=50"]}
    with pytest.raises(Exception, match=r"params.training.overrides.1.*'train.max_step=50'"):
        run_deployment(
            deployment_id,
            parameters={"params": {"data": {"corpus": "c"}, "training": misspelt}},
            timeout=0,
        )
    with pytest.raises(Exception, match=r"params.data.prepare.0.*'max_vocabb=5'"):
        run_deployment(
            deployment_id,
            parameters={"params": {"data": {"corpus": "c", "prepare": ["max_vocabb=5"]}}},
            timeout=0,
        )
    state = pretrain(
        params={"data": {"corpus": "c"}, "training": {"overrides": ["train.max_stepz=1"]}},
        return_state=True,
    )
    assert state.is_failed()
    assert "params.training.overrides.0: String should match pattern" in state.message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("variable", "value", "mode"),
    [
        ("MLFLOW_TRACKING_URI", "http://127.0.0.1:{port}", "local"),
        ("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:{port}", "ray-job"),
        ("RAY_ADDRESS", "127.0.0.1:{port}", "local"),
    ],
)
def test_an_unreachable_server_fails_the_run_before_any_stage_naming_it(
    home: Path, corpus: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, mode: str
) -> None:
    address = value.format(port=_closed_port())
    monkeypatch.setenv(variable, address)
    params = PretrainParams.model_validate(
        {"data": _data(corpus), "training": {**TRAINING, "mode": mode}}
    )

    with pytest.raises(ServiceUnreachable, match=f"{variable}={address}"):
        pretrain(params)


# --- make run: what a user reads -----------------------------------------------------------------

# The libraries' chatter that runs printed before each source was turned off (see
# pipelines.common.console, flows.run_local.embedded_settings, the train loop's Adagrad step).
CONSOLE_NOISE = (
    "Failed to query Ray Train Controller",  # the PlacementGroupCleaner without a state API
    "Failed to send resource request",  # the controller's autoscaling request, on a busy core
    "PreemptionWatcher",
    "Downloading artifacts",  # MLflow's progress bars
    "Sparse invariant checks",  # torch's Adagrad on sparse gradients
    "Started a local Ray instance",
    "Token authentication is enabled",
    "temporary server",  # Prefect's ephemeral server starting and stopping
    "INFO mlflow",  # MLflow's routine steps
    "\x1b[",  # colour codes (Ray's worker prefixes) in what is not a terminal
    "pid=",  # Ray's "(RayTrainWorker pid=…)" and "(run_adapt_job pid=…)" prefixes
    "TrainingReport(",  # Ray Train's record of each report, at a worker's INFO
    "generated new fontManager",  # matplotlib's first import, at a worker's INFO
    "Setting up process group",  # Ray Train's INFO, once its structured logging is off
    "Successfully registered model",  # MLflow's register_model, beside our own line
    "Created version",
    "already exists. Creating",
)
SCORES = r"[\d.]+"  # one seed: no error bars
VERDICT = r"\(gain [+-][\d.]+ \(one seed: no standard deviation\)\)"
LAYERS = r"layer \d( and layer \d)*"  # the best layer, or those that tie


def winner(others: str = "") -> str:
    """The best layers and their score, every layer scoring perfectly (saturated), or, a probe,
    none clearing its baseline (its scores shown with those on its training data)."""
    score = rf"{SCORES}( \(train {SCORES}\))?"
    best = rf"best {LAYERS} \({score}\)"
    saturated = rf"saturated: every layer scores {score} on every seed"
    if not others:
        return f"({best}|{saturated})"
    best = rf"best {LAYERS} \({score}; {others}\)"
    saturated = rf"{saturated} \({others}\)"
    none = rf"no layer clears its baseline by 5 points, so none wins \(best {score}; {others}\): "
    return f"({best}|{saturated}|{none}the probe barely learns)"


# The tasks the test's ``make run`` adapts and analyzes, and their main metric: one tagging task
# (the probe's) of the three bundled, for time; the demo's default adapts all three.
MAKE_RUN_TASKS = (("ner", "f1"),)
MAKE_RUN_ENDING = (
    r"biLM models:/elmo-bilm/1 \(@champion\): heldout perplexity [\d.]+",
    *(
        rf"task {task}: test {metric} {SCORES} with ELMo, {SCORES} without \(seed 0; \d+ test "
        rf"examples\): gain [+-][\d.]+ \(one seed: no standard deviation\) → models:/elmo-{task}/\d"
        for task, metric in MAKE_RUN_TASKS
    ),
    r"MLflow UI: mlflow ui --backend-store-uri sqlite:///\S+/mlflow\.db --workers 1",
    r"  then open http://127\.0\.0\.1:5000/#/experiments/\d+\?workflowType=machine_learning",
    r"Prefect UI: PREFECT_HOME=\S+/home/prefect prefect server start",
    r"  then open http://127\.0\.0\.1:4200/runs/flow-run/[\da-f-]{36}",
    r"'bank' in two senses, from mlflow\.pyfunc\.load_model\('models:/elmo-bilm@champion'\).*",
    r"  1: She went to the bank to withdraw money \.",
    r"  2: They sat on the bank of the river \.",
    r"  cosine distance between the two 'bank' vectors, per layer:",
    r"    0  token layer \(characters only\) +0\.000000",
    r"    1  LSTM layer 1 +0\.(?!0{6})\d{6}",  # not zero
    r"    2  LSTM layer 2 +0\.(?!0{6})\d{6}",  # not zero
    r"  one pair of vectors says little; the sense probe of the analysis measures each layer .*",
    r"",
    r"The analysis \(elmo analyze\), in short:",
    *(
        rf"  {task}: with \d+% of its training data, test_{metric} {SCORES} with ELMo, {SCORES} "
        rf"without {VERDICT}; each layer alone: {winner()}"
        for task, metric in MAKE_RUN_TASKS
    ),
    "  ner linear probe accuracy: " + winner(rf"majority {SCORES}"),
    "  word sense, nearest centroid accuracy: " + winner(rf"MFS {SCORES}"),
)


# Whichever of its tests comes first runs the fixture's whole run within its own timeout: 457 s on
# the emulated slow machine, beside the suite (benchmarks/results/suite_slow-2026-11-30.md).
MAKE_RUN_TIMEOUT = pytest.mark.timeout(1600)
MAKE_RUN_SECONDS = 1400  # the run's own limit, within the test's


@pytest.fixture(scope="module")
def make_run_console(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What ``make run`` prints (stdout and stderr as a terminal shows them) on a fresh machine:
    no server or ELMo setting in the environment (but the tests' Ray niceness and OpenMP wait
    policy), a new ELMO_HOME. 2 training steps, one task, one seed and the whole training set,
    for time (the pretrain flow's log test reads the lines of three seeds). Once: what a second
    run reuses, the flows' own tests check in this process (a rerun of the pretrain flow, of the
    analyze flow)."""
    home = tmp_path_factory.mktemp("make-run") / "home"
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ELMO_", "MLFLOW_", "PREFECT_", "RAY_"))
    }
    env |= {"ELMO_HOME": str(home), "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    env["RAY_worker_niceness"] = "0"  # a fair share for Ray, as tests/conftest.py says
    command = [sys.executable, "-m", "flows.run_local", "--max-steps", "2", "--seeds", "0"]
    tasks = (str(REPO / f"examples/tasks/{task}.yaml") for task, _ in MAKE_RUN_TASKS)
    command += ["--fractions", "1", "--tasks", ",".join(tasks)]
    # In a process group of its own: a run past its time goes with every process it started
    # (its Prefect server, its Ray), which would otherwise slow every test after it.
    run = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        printed, _ = run.communicate(timeout=MAKE_RUN_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        printed, _ = run.communicate()
        pytest.fail(f"make run took over {MAKE_RUN_SECONDS} s:\n{printed[-3000:]}")
    assert run.returncode == 0, printed[-3000:]
    return printed.splitlines()


def test_task_runs_are_named_after_their_work_and_training_fills_its_progress_bar(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    for summary, flow_run_id in two_runs:  # the second reuses the first's training
        bilm = summary.train_run
        named = {f"{stage}-{bilm}" for stage in ("train", "evaluate", "register")}
        named |= {"prepare-corpus.txt", "adapt-ner", "summarize"}
        assert named <= _task_run_names(flow_run_id)
        progress = _artifacts(flow_run_id)[TRAINING_PROGRESS_KEY]
        assert progress.type == "progress" and float(progress.data) == 100.0
        assert progress.description.startswith(f"biLM {bilm} ")  # what the run did
        adapted = _artifacts(flow_run_id)[progress_key("adapt")]
        assert adapted.type == "progress" and float(adapted.data) == 100.0
        assert adapted.description == "adapted ner, each with and without ELMo over 3 seeds"


def test_the_train_tasks_own_page_shows_every_logged_step_and_validation_once(
    two_runs: list[tuple[PretrainSummary, UUID]],
) -> None:
    _, flow_run_id = two_runs[0]
    lines = _task_log_messages(flow_run_id, "train")

    steps = [int(m[1]) for line in lines if (m := re.search(r": step (\d+)/8  sampled", line))]
    validations = [
        int(m[1]) for line in lines if (m := re.search(r": step (\d+): validation", line))
    ]
    assert steps == [4, 8] and validations == [4, 8]  # log_every and validate_every 4
    assert any(
        re.search(rf"^train run of biLM bilm-\w+ in MLflow: {RUN_URL}", line) for line in lines
    )


@MAKE_RUN_TIMEOUT
def test_make_run_prints_every_line_once_and_none_of_the_libraries_chatter(
    make_run_console: list[str],
) -> None:
    printed = [line for line in make_run_console if line.strip()]
    console = "\n".join(printed[-150:])  # what a failure shows, to tell where a line came from
    assert sorted({line for line in printed if printed.count(line) > 1}) == [], console
    noise = [line for line in printed if any(noise in line for noise in CONSOLE_NOISE)]
    assert noise == [], console
    # each progress line once, from the flow's log (the workers print none of it)
    assert sum(": step 2/2  sampled loss " in line for line in printed) == 1
    assert not [line for line in printed if "[train]" in line]


@MAKE_RUN_TIMEOUT
def test_make_run_names_the_training_run_and_links_each_stages_mlflow_run_to_the_console(
    make_run_console: list[str],
) -> None:
    """What the flow's log says reaches the console too, as each stage runs."""
    linked = [
        "the flow run's parent run",
        r"train run of biLM bilm-\w+",
        "evaluate run",
        "register run",
        *(f"adapt run of task {task}" for task, _ in MAKE_RUN_TASKS),
        "analyze run",
    ]
    text = "\n".join(make_run_console)
    assert re.search(r" - train: biLM bilm-\w+, preset mini, dataset python-docs-\w+$", text, re.M)
    for what in linked:
        assert re.search(rf" - {what} in MLflow: {RUN_URL}", text, re.MULTILINE), what


@MAKE_RUN_TIMEOUT
def test_make_run_ends_with_the_model_its_task_scores_the_ui_links_and_bank_in_two_senses(
    make_run_console: list[str],
) -> None:
    ending = make_run_console[-len(MAKE_RUN_ENDING) :]
    for pattern, line in zip(MAKE_RUN_ENDING, ending, strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)
