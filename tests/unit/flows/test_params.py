"""Flow parameters: typed, closed, resolved early; the deployment schema derived from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prefect.utilities.callables import parameter_schema
from pydantic import ValidationError

from flows.analyze import analyze
from flows.params import AdaptParams, AnalyzeParams, DataParams, PretrainParams, TrainingParams
from flows.pretrain import pretrain


def test_unknown_keys_are_rejected_with_their_path() -> None:
    with pytest.raises(ValidationError) as raised:
        PretrainParams.model_validate({"data": {"corpus": "c"}, "training": {"num_workerz": 2}})

    assert "training.num_workerz" in str(raised.value)
    assert "Extra inputs are not permitted" in str(raised.value)


def test_ill_typed_and_unknown_preset_values_are_rejected() -> None:
    with pytest.raises(ValidationError, match="training.num_workers"):
        PretrainParams.model_validate({"data": {"corpus": "c"}, "training": {"num_workers": "x"}})
    with pytest.raises(ValidationError, match="training.model"):
        PretrainParams.model_validate({"data": {"corpus": "c"}, "training": {"model": "huge"}})


def test_a_misspelt_override_fails_at_validation_naming_its_entry() -> None:
    with pytest.raises(ValidationError, match=r"overrides.0\n.*pattern.*train.max_stepz=3"):
        TrainingParams(model="tiny", overrides=["train.max_stepz=3"])
    with pytest.raises(ValidationError, match=r"data.prepare: .*key 'max_vocab'"):
        DataParams(corpus="c", prepare=["max_vocab=lots"])


def test_the_json_schema_carries_the_override_keys_for_the_server_to_check() -> None:
    schema = PretrainParams.model_json_schema()["$defs"]
    pattern = schema["TrainingParams"]["properties"]["overrides"]["items"]["pattern"]
    assert re.search(pattern, "train.max_steps=300") and re.search(pattern, "model.dropout=0.2")
    assert not re.search(pattern, "train.max_step=300")
    assert not re.search(pattern, "max_steps=300")
    prepare = schema["DataParams"]["properties"]["prepare"]["items"]["pattern"]
    assert re.search(prepare, "max_vocab=50000") and not re.search(prepare, "max_vocabb=5")


def test_the_best_model_is_handed_on_unless_the_final_one_is_asked_for() -> None:
    assert TrainingParams().hand_on == "best"
    assert TrainingParams(hand_on="final").hand_on == "final"
    with pytest.raises(ValidationError, match="training.hand_on"):
        PretrainParams.model_validate({"data": {"corpus": "c"}, "training": {"hand_on": "last"}})
    schema = PretrainParams.model_json_schema()["$defs"]["TrainingParams"]["properties"]
    assert schema["hand_on"]["enum"] == ["best", "final"]  # a choice in Prefect's UI


def test_scaling_fields_reach_the_resolved_train_config() -> None:
    training = TrainingParams(
        model="tiny", overrides=["train.max_steps=7"], num_workers=3, use_gpu=True
    )

    cfg = training.job_config()

    assert (cfg.run.num_workers, cfg.run.use_gpu, cfg.train.max_steps) == (3, True, 7)
    assert cfg.model.lstm.cell_dim == 32  # the tiny preset
    assert training.train_overrides()[-2:] == ["run.num_workers=3", "run.use_gpu=true"]


def test_the_config_is_resolved_once_when_the_parameters_are_validated() -> None:
    training = TrainingParams(model="tiny", overrides=["train.max_steps=7"], num_workers=3)

    assert training.job_config() is training.job_config()
    assert training.model_copy().job_config() == training.job_config()
    assert TrainingParams.model_validate(training.model_dump()) == training


def test_mode_defaults_to_ray_job_only_when_a_jobs_api_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert TrainingParams().resolved_mode() == "local"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265")
    assert TrainingParams().resolved_mode() == "ray-job"
    assert TrainingParams(mode="local").resolved_mode() == "local"


def test_default_dataset_dir_is_under_elmo_home_and_differs_by_corpus_and_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ELMO_HOME", str(tmp_path))
    base = DataParams(corpus="/data/my corpus/")

    assert Path(base.dataset_dir()).parent == tmp_path / "datasets"
    assert Path(base.dataset_dir()).name.startswith("my-corpus-")
    assert base.dataset_dir() == DataParams(corpus="/data/my corpus/").dataset_dir()
    assert base.dataset_dir() != DataParams(corpus="/data/other").dataset_dir()
    assert base.dataset_dir() != DataParams(corpus=base.corpus, prepare=["seed=1"]).dataset_dir()
    assert DataParams(corpus="c", out="s3://b/d").dataset_dir() == "s3://b/d"


def test_the_flow_schema_forbids_extra_keys_and_lists_the_presets() -> None:
    schema = parameter_schema(pretrain.fn).model_dump()
    definitions = schema["definitions"]

    assert schema["required"] == ["params"]
    assert all(d.get("additionalProperties") is False for d in definitions.values())
    assert definitions["TrainingParams"]["properties"]["model"]["enum"] == [
        "tiny",
        "mini",
        "small",
        "medium",
        "original",
    ]
    assert definitions["PretrainParams"]["required"] == ["data"]


def test_adapt_needs_at_least_one_task_and_defaults_to_the_champion() -> None:
    with pytest.raises(ValidationError, match="tasks"):
        AdaptParams(tasks=[])
    assert AdaptParams(tasks=["t.yaml"]).bilm == "models:/elmo-bilm@champion"


def test_pretrain_analyzes_only_when_asked() -> None:
    assert PretrainParams(data=DataParams(corpus="c")).analyze is False
    assert PretrainParams.model_validate({"data": {"corpus": "c"}, "analyze": True}).analyze


def test_analyze_defaults_to_the_champion_and_the_papers_fractions_and_seeds() -> None:
    params = AnalyzeParams(tasks=["t.yaml"])

    assert params.bilm == "models:/elmo-bilm@champion"
    assert (params.fractions, params.seeds) == ([0.01, 0.05, 0.1, 0.25, 1.0], [0, 1, 2])
    assert params.senses() is None
    with pytest.raises(ValidationError, match="tasks"):
        AnalyzeParams(tasks=[])


@pytest.mark.parametrize("given", ["senses_train", "senses_test"])
def test_analyze_takes_both_sense_files_or_neither_naming_the_missing_one(given: str) -> None:
    missing = ({"senses_train", "senses_test"} - {given}).pop()
    with pytest.raises(ValidationError, match=f"{missing}: give senses_train and senses_test"):
        AnalyzeParams.model_validate({"tasks": ["t.yaml"], given: "s.tsv"})

    both = AnalyzeParams(tasks=["t.yaml"], senses_train="a.tsv", senses_test="b.tsv")
    assert both.senses() == (Path("a.tsv"), Path("b.tsv"))


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"fractions": [0.5, 0.0]}, "fractions.1"),
        ({"fractions": [1.5]}, "fractions.0"),
        ({"fractions": []}, "fractions"),
        ({"seeds": []}, "seeds"),
        ({"seeds": ["first"]}, "seeds.0"),
        ({"sense_train": "s.tsv"}, "sense_train"),
    ],
)
def test_analyze_refuses_bad_fractions_seeds_and_keys_naming_the_field(
    update: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        AnalyzeParams.model_validate({"tasks": ["t.yaml"], **update})

    assert raised.value.errors()[0]["loc"] == tuple(
        int(part) if part.isdigit() else part for part in field.split(".")
    )


def test_the_analyze_schema_bounds_the_fractions_for_the_server_to_check() -> None:
    schema = parameter_schema(analyze.fn).model_dump()
    properties = schema["definitions"]["AnalyzeParams"]["properties"]

    assert schema["definitions"]["AnalyzeParams"]["additionalProperties"] is False
    assert properties["fractions"]["items"] == {
        "exclusiveMinimum": 0,
        "maximum": 1,
        "type": "number",
    }
    assert properties["seeds"]["minItems"] == 1
