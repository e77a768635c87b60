"""prefect.yaml: every deployment's entrypoint exists and its parameters validate; the one-command
demo runs the smoke deployment's parameters."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from elmo_core.analysis.sampling import check_fractions
from elmo_core.tasks import load_task_config
from flows.params import AdaptParams, AnalyzeParams, EmbedParams, PretrainParams
from flows.run_local import REPO, smoke_parameters
from pipelines.common.task_data import read_splits

PARAMS_OF: dict[str, type[BaseModel]] = {
    "pretrain": PretrainParams,
    "adapt": AdaptParams,
    "analyze": AnalyzeParams,
    "embed": EmbedParams,
}
DEPLOYMENTS = ["pretrain/full", "pretrain/smoke", "adapt/smoke", "analyze/smoke", "embed/smoke"]
ONE_BILLION_WORD = "https://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz"


def _deployments() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    named = {}
    for deployment in config["deployments"]:
        path, function = deployment["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, function)
        named[f"{flow.name}/{deployment['name']}"] = deployment
    return named


def test_the_documented_deployments_exist_on_the_process_pool() -> None:
    deployments = _deployments()

    assert set(deployments) == set(DEPLOYMENTS)
    assert {d["work_pool"]["name"] for d in deployments.values()} == {"elmo-process"}


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_deployment_parameters_validate_against_the_flow_params(name: str) -> None:
    deployment = _deployments()[name]
    params = deployment["parameters"]["params"]
    PARAMS_OF[name.split("/")[0]].model_validate(params)
    paths = [*params.get("tasks", []), params.get("senses_train"), params.get("senses_test")]
    for path in filter(None, paths):
        assert (REPO / path).is_file()


def test_full_trains_the_original_model_on_the_1b_word_benchmark_on_gpus() -> None:
    params = PretrainParams.model_validate(_deployments()["pretrain/full"]["parameters"]["params"])

    assert params.data.corpus == ONE_BILLION_WORD
    assert params.data.format == "1b-benchmark"
    assert (params.training.model, params.training.mode) == ("original", "ray-job")
    assert params.training.use_gpu and params.training.num_workers == 4


def test_embed_smoke_embeds_the_bundled_corpus_with_the_champion_into_elmo_home(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    params = EmbedParams.model_validate(_deployments()["embed/smoke"]["parameters"]["params"])

    assert (params.input, params.bilm) == ("python-docs", "models:/elmo-bilm@champion")
    assert (params.output, params.format, params.dtype) == ("mix", "hdf5", "float16")
    out = params.out_dir()
    assert out.startswith(str(tmp_path / "embeddings" / "python-docs-"))
    assert params.model_copy(update={"output": "top"}).out_dir() != out


def test_analyze_smoke_probes_the_champion_on_both_bundled_tasks_and_the_sense_set() -> None:
    params = AnalyzeParams.model_validate(_deployments()["analyze/smoke"]["parameters"]["params"])

    assert params.bilm == "models:/elmo-bilm@champion"
    assert params.senses() == (
        Path("examples/analysis/data/senses.train.tsv"),
        Path("examples/analysis/data/senses.test.tsv"),
    )
    for path in params.tasks:  # each fraction keeps an example of every label: checked up front
        task = load_task_config(REPO / path)
        check_fractions(list(read_splits(task)["train"].examples), params.fractions, task.name)
    assert {load_task_config(REPO / path).type for path in params.tasks} == {
        "classification",
        "tagging",
    }


def test_the_local_demo_runs_the_smoke_deployments_parameters() -> None:
    smoke = _deployments()["pretrain/smoke"]["parameters"]["params"]
    smoke = {**smoke, "tasks": [str(REPO / path) for path in smoke["tasks"]]}

    assert PretrainParams.model_validate(smoke) == PretrainParams.model_validate(smoke_parameters())
    params = PretrainParams.model_validate(smoke)
    assert params.training.model == "mini"
    assert params.training.job_config().train.max_steps <= 2000
    assert params.analyze and len(params.seeds) >= 3
    for path in params.tasks:
        task = load_task_config(path)
        check_fractions(list(read_splits(task)["train"].examples), params.fractions, task.name)


def test_the_working_directory_comes_from_elmo_repo() -> None:
    config = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (step,) = config["pull"]
    assert step == {
        "prefect.deployments.steps.set_working_directory": {"directory": "{{ $ELMO_REPO }}"}
    }
