"""task_pyfunc: a saved task model reloads exactly; the predictor reads every input layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException

from elmo_core.errors import DataError, WeightsError
from elmo_core.model.bilm import BiLM
from elmo_core.model.serialization import write_bilm_dir
from elmo_core.presets import tiny
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import TaskModel, build_word_vocab, live_inputs
from elmo_core.tasks.trainer import predict
from elmo_core.text.tokenize import WhitespaceTokenizer
from pipelines.serving import task_pyfunc
from pipelines.serving.pyfunc_request import MAX_ROWS_ENV, MAX_TOKENS_ENV

SENTENCES = [["The", "cat", "sat", "."], ["Dogs", "bark", "loudly", "."], ["Hi", "!"]]
TAGS = ["B-X", "I-X", "O"]
LABELS = ["neg", "pos"]


def _model(task_type: str, use_elmo: bool = True) -> TaskModel:
    torch.manual_seed(0)
    task = TaskConfig.model_validate(
        {
            "name": "toy",
            "type": task_type,
            "format": {"tagging": "conll2003", "classification": "label_text", "pair": "snli"}[
                task_type
            ],
            "train": "train.txt",
            "head": {"hidden_dim": 8, "crf": task_type == "tagging", "elmo_at_output": True},
        }
    )
    labels = TAGS if task_type == "tagging" else LABELS
    vocab = build_word_vocab(SENTENCES * 2)
    config = tiny()
    return TaskModel(task, 3, 2 * config.lstm.projection_dim, vocab, labels, use_elmo).eval()


@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    return write_bilm_dir(BiLM(tiny(), 100), tmp_path_factory.mktemp("bilm") / "bilm")


def _predictor(
    model: TaskModel, tmp_path: Path, bilm_dir: Path, tokenizer: dict[str, Any] | None = None
) -> task_pyfunc.TaskPredictor:
    task_dir = task_pyfunc.save_task_model(model, tmp_path / "task", tokenizer)
    predictor = task_pyfunc.TaskPredictor()
    predictor.load(task_dir, bilm_dir)
    return predictor


def test_saved_task_model_reloads_with_identical_weights_and_predictions(
    tmp_path: Path, bilm_dir: Path
) -> None:
    model = _model("tagging")
    with torch.no_grad():
        model.mixes["input"].scalar_parameters[0].fill_(0.7)  # not the initial value
    directory = task_pyfunc.save_task_model(model, tmp_path / "task", {"name": "whitespace"})
    loaded, tokenizer = task_pyfunc.load_task_model(directory)
    assert tokenizer == {"name": "whitespace"}
    assert (loaded.vocab, loaded.labels, loaded.task) == (model.vocab, model.labels, model.task)
    original = model.state_dict()
    assert all(torch.equal(original[k], v) for k, v in loaded.state_dict().items())
    bilm = BiLM(tiny(), 100)
    bilm.load_state_dict(torch.load(bilm_dir / "model.pt", weights_only=True))
    assert predict(loaded, SENTENCES, bilm.eval()) == predict(model, SENTENCES, bilm)


def test_tagging_predictor_returns_one_tag_per_token_from_text_or_tokens(
    tmp_path: Path, bilm_dir: Path
) -> None:
    predictor = _predictor(_model("tagging"), tmp_path, bilm_dir)
    by_text = predictor.predict(None, pd.DataFrame({"sentence": ["The cat sat.", "Hi!"]}))
    assert by_text["tokens"].tolist() == [["The", "cat", "sat", "."], ["Hi", "!"]]  # Moses
    assert [len(tags) for tags in by_text["tags"]] == [4, 2]
    assert {tag for tags in by_text["tags"] for tag in tags} <= set(TAGS)
    by_tokens = predictor.predict(None, pd.DataFrame({"tokens": by_text["tokens"].tolist()}))
    assert by_tokens["tags"].tolist() == by_text["tags"].tolist()


def test_classifier_uses_the_saved_tokenizer_and_returns_one_label_per_row(
    tmp_path: Path, bilm_dir: Path
) -> None:
    model = _model("classification")
    predictor = _predictor(model, tmp_path, bilm_dir, WhitespaceTokenizer().describe())
    out = predictor.predict(None, pd.DataFrame({"sentence": ["The cat sat.", "Hi !"]}))
    assert out["tokens"].tolist() == [["The", "cat", "sat."], ["Hi", "!"]]  # whitespace
    assert list(out.columns) == ["tokens", "label"]
    assert set(out["label"]) <= set(LABELS)


def test_pair_predictor_reads_premise_and_hypothesis_as_text_or_tokens(
    tmp_path: Path, bilm_dir: Path
) -> None:
    predictor = _predictor(_model("pair"), tmp_path, bilm_dir)
    text = pd.DataFrame({"premise": ["The cat sat.", "Hi!"], "hypothesis": ["A cat.", "Bye."]})
    tokens = pd.DataFrame(
        {
            "premise_tokens": [["The", "cat", "sat", "."], ["Hi", "!"]],
            "hypothesis_tokens": [["A", "cat", "."], ["Bye", "."]],
        }
    )
    labels = predictor.predict(None, text)["label"].tolist()
    assert len(labels) == 2 and set(labels) <= set(LABELS)
    assert predictor.predict(None, tokens)["label"].tolist() == labels


def test_missing_input_column_is_an_invalid_parameter_error_naming_both_layouts(
    tmp_path: Path, bilm_dir: Path
) -> None:
    predictor = _predictor(_model("classification"), tmp_path, bilm_dir)
    with pytest.raises(MlflowException, match="'sentence' \\(text\\) or 'tokens'") as caught:
        predictor.predict(None, pd.DataFrame({"text": ["hello"]}))
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    assert isinstance(caught.value.__cause__, DataError)


def test_a_list_of_premises_in_one_row_is_refused_as_the_bilm_refuses_it(
    tmp_path: Path, bilm_dir: Path
) -> None:
    predictor = _predictor(_model("pair"), tmp_path, bilm_dir)
    frame = pd.DataFrame({"premise": [["A cat.", "A dog."]], "hypothesis": ["An animal."]})
    with pytest.raises(MlflowException, match="'premise' holds one text per row"):
        predictor.predict(None, frame)


@pytest.mark.parametrize(
    ("params", "message"),
    [({"batch_size": 0}, "batch_size must be positive"), ({"layer": 1}, "unknown predict params")],
)
def test_bad_params_are_invalid_parameter_errors(
    tmp_path: Path, bilm_dir: Path, params: dict[str, Any], message: str
) -> None:
    predictor = _predictor(_model("tagging"), tmp_path, bilm_dir)
    with pytest.raises(MlflowException, match=message) as caught:
        predictor.predict(None, pd.DataFrame({"sentence": ["Hi!"]}), params=params)
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"


def test_rows_without_tokens_get_no_tags_and_do_not_change_the_others(
    tmp_path: Path, bilm_dir: Path
) -> None:
    predictor = _predictor(_model("tagging"), tmp_path, bilm_dir)
    alone = predictor.predict(None, pd.DataFrame({"tokens": SENTENCES}))["tags"].tolist()
    only_empty = predictor.predict(None, pd.DataFrame({"sentence": ["", " "]}))
    assert only_empty.to_dict("list") == {"tokens": [[], []], "tags": [[], []]}
    mixed = predictor.predict(None, pd.DataFrame({"tokens": [[], *SENTENCES, []]}))
    assert mixed["tags"].tolist() == [[], *alone, []]


@pytest.mark.parametrize("task_type", ["classification", "pair"])
def test_rows_without_tokens_have_no_label(tmp_path: Path, bilm_dir: Path, task_type: str) -> None:
    predictor = _predictor(_model(task_type), tmp_path, bilm_dir)
    if task_type == "pair":  # an empty premise or hypothesis leaves nothing to compare
        frame = pd.DataFrame(
            {"premise": ["", "Hi!", "A cat."], "hypothesis": ["Bye.", "", "A pet."]}
        )
    else:
        frame = pd.DataFrame({"sentence": ["", " ", "A cat."]})
    labels = predictor.predict(None, frame)["label"].tolist()
    assert labels[:2] == [None, None] and labels[2] in LABELS
    assert predictor.predict(None, frame[:2])["label"].tolist() == [None, None]


def test_the_environment_limits_tokens_per_sentence_and_rows_per_request(
    tmp_path: Path, bilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_TOKENS_ENV, "3")
    monkeypatch.setenv(MAX_ROWS_ENV, "2")
    predictor = _predictor(_model("pair"), tmp_path, bilm_dir)
    long = pd.DataFrame({"premise": ["Hi!"], "hypothesis": ["A cat sat."]})
    with pytest.raises(
        MlflowException, match="row 0: 'hypothesis' has 4 tokens, over the limit of 3"
    ):
        predictor.predict(None, long)
    many = pd.DataFrame({"premise": ["Hi!"] * 3, "hypothesis": ["Bye."] * 3})
    with pytest.raises(MlflowException, match="3 rows, over the limit of 2 per request"):
        predictor.predict(None, many)


def test_batch_size_does_not_change_the_predictions(tmp_path: Path, bilm_dir: Path) -> None:
    predictor = _predictor(_model("tagging"), tmp_path, bilm_dir)
    frame = pd.DataFrame({"tokens": SENTENCES})
    one_by_one = predictor.predict(None, frame, params={"batch_size": 1})
    assert one_by_one["tags"].tolist() == predictor.predict(None, frame)["tags"].tolist()


def test_a_directory_without_a_task_model_is_a_weights_error(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="not a saved task model"):
        task_pyfunc.load_task_model(tmp_path)


@pytest.mark.parametrize(
    ("task_type", "outputs"),
    [("tagging", ["tokens", "tags"]), ("classification", ["tokens", "label"]), ("pair", ["label"])],
)
def test_signature_names_the_inputs_and_outputs_of_each_task_type(
    task_type: str, outputs: list[str]
) -> None:
    signature = task_pyfunc.model_signature(task_type)  # type: ignore[arg-type]
    assert signature.outputs.input_names() == outputs
    expected = (
        ["premise", "hypothesis", "premise_tokens", "hypothesis_tokens"]
        if task_type == "pair"
        else ["sentence", "tokens"]
    )
    assert signature.inputs.input_names() == expected
    assert not any(spec.required for spec in signature.inputs.inputs)
    assert [(spec.name, spec.default) for spec in signature.params.params] == [("batch_size", 64)]


PINNED = Path(__file__).parent / "data" / "pinned_task_models"
PINNED_SENTENCES = [*SENTENCES, ["The", "dogs", "sat", "."]]


@pytest.mark.parametrize("task_type", ["tagging", "classification", "pair"])
def test_a_model_saved_before_the_task_types_moved_loads_and_predicts_the_same(
    task_type: str,
) -> None:
    """``data/pinned_task_models``: a tiny ELMo model of each type (random weights, biLM
    included), saved with its scores and predictions by the tree of 2026-11-29 in which each
    type's code was still spread over six files. Its files, read now, give the same answers."""
    expected = json.loads((PINNED / "predictions.json").read_text())[task_type]
    model, tokenizer = task_pyfunc.load_task_model(PINNED / task_type)
    bilm = BiLM(tiny(), 100)
    bilm.load_state_dict(torch.load(PINNED / "bilm" / "model.pt", weights_only=True))
    bilm.eval()
    rows: list[Any] = PINNED_SENTENCES
    sides = [PINNED_SENTENCES]
    if task_type == "pair":
        rows = list(
            zip(PINNED_SENTENCES, [*PINNED_SENTENCES[1:], PINNED_SENTENCES[0]], strict=True)
        )
        sides = [[a for a, _ in rows], [b for _, b in rows]]
    with torch.no_grad():
        scores = model([live_inputs(model, side, bilm) for side in sides])
    assert tokenizer == {"name": "whitespace"}
    torch.testing.assert_close(scores, torch.tensor(expected["scores"]), rtol=1e-5, atol=1e-5)
    assert predict(model, rows, bilm) == expected["predictions"]
