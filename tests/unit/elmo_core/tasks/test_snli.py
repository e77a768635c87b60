import json

import pytest

from elmo_core.errors import DataError
from elmo_core.tasks.snli import read_snli

RECORDS = [
    {
        "gold_label": "neutral",
        "sentence1": "A person on a horse jumps over a broken down airplane.",
        "sentence2": "A person is training his horse for a competition.",
        "sentence1_binary_parse": "( ( ( A person ) ( on ( a horse ) ) ) ( ( jumps ( over "
        "( a ( broken ( down airplane ) ) ) ) ) . ) )",
        "sentence2_binary_parse": "( ( A person ) ( ( is ( ( training ( his horse ) ) ( for "
        "( a competition ) ) ) ) . ) )",
    },
    {"gold_label": "-", "sentence1": "Two men.", "sentence2": "Men."},
    {"gold_label": "entailment", "sentence1": "Kids play.", "sentence2": "Children play ."},
    {"gold_label": "contradiction", "sentence1": "A dog.", "sentence2": ""},
]


def write_jsonl(tmp_path, lines, name="snli.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_pairs_and_counts_skipped(tmp_path):
    dataset = read_snli(write_jsonl(tmp_path, [json.dumps(record) for record in RECORDS]))
    assert len(dataset) == 2
    first = dataset[0]
    assert first.premise[-3:] == ["down", "airplane", "."]  # parse leaves split the final '.'
    assert first.hypothesis[:3] == ["A", "person", "is"]
    assert first.label == "neutral"
    assert dataset[1].premise == ["Kids", "play."]  # no parse field: whitespace split
    assert dataset.skipped == {"no_gold_label": 1, "empty_sentence": 1}
    assert dataset.labels() == ["entailment", "neutral"]


def test_whitespace_tokenization_ignores_the_parse(tmp_path):
    dataset = read_snli(write_jsonl(tmp_path, [json.dumps(RECORDS[0])]), tokenization="whitespace")
    assert dataset[0].premise[-2:] == ["down", "airplane."]


def test_bad_json_names_the_line(tmp_path):
    lines = [json.dumps(RECORDS[0]), "", '{"gold_label": "neutral", "sentence1": ']
    with pytest.raises(DataError, match=r"snli.jsonl:3: invalid JSON") as caught:
        read_snli(write_jsonl(tmp_path, lines))
    assert caught.value.line == 3


def test_missing_field_and_non_object_name_the_line(tmp_path):
    lines = [json.dumps({"gold_label": "neutral", "sentence1": "A b."})]
    with pytest.raises(DataError, match=r"snli.jsonl:1: missing field 'sentence2'"):
        read_snli(write_jsonl(tmp_path, lines))
    with pytest.raises(DataError, match=r"x.jsonl:1: expected a JSON object, got list"):
        read_snli(write_jsonl(tmp_path, ["[1, 2]"], name="x.jsonl"))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_snli(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match=r"no examples in file \(skipped: 1 no_gold_label\)"):
        read_snli(write_jsonl(tmp_path, [json.dumps(RECORDS[1])]))
