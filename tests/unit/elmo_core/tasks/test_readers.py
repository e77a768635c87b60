import json

import pytest

from elmo_core.errors import ConfigError, DataError
from elmo_core.tasks.dataset import ClassificationExample, PairExample, TaggingExample
from elmo_core.tasks.readers import check_labels, read_task_split, task_labels
from elmo_core.tasks.task_config import TaskConfig


def make_task(tmp_path, format, type, files, **extra):
    paths = {}
    for split, text in files.items():
        paths[split] = tmp_path / f"{split}.data"
        paths[split].write_text(text, encoding="utf-8")
    return TaskConfig.model_validate(
        {"name": "t", "type": type, "format": format, **paths, **extra}
    )


def test_dispatches_tagging_formats(tmp_path):
    task = make_task(
        tmp_path,
        "conll2003",
        "tagging",
        {"train": "EU B-ORG\nsays O\n"},
        reader={"tag_scheme": "iob2"},
    )
    train = read_task_split(task, "train")
    assert train.examples == [TaggingExample(tokens=["EU", "says"], tags=["B-ORG", "O"])]
    conllu = "1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n"
    task = make_task(
        tmp_path, "conllu", "tagging", {"train": conllu}, reader={"conllu_column": "xpos"}
    )
    assert read_task_split(task, "train")[0].tags == ["UH"]


def test_sst_phrases_apply_to_train_only(tmp_path):
    tree = "(1 (2 Not) (1 good))\n"
    task = make_task(
        tmp_path,
        "sst",
        "classification",
        {"train": tree, "dev": tree},
        reader={"sst_phrases": True},
    )
    assert len(read_task_split(task, "train")) == 3
    assert read_task_split(task, "dev").examples == [
        ClassificationExample(tokens=["Not", "good"], label="1")
    ]


def test_dispatches_text_and_pair_formats(tmp_path):
    task = make_task(tmp_path, "label_text", "classification", {"train": "NUM:date When ?\n"})
    assert read_task_split(task, "train")[0].label == "NUM:date"
    task = make_task(
        tmp_path,
        "tsv",
        "classification",
        {"train": "h\th\nfine film\t1\n"},
        reader={"tsv_label_column": "last", "tsv_header": True},
    )
    assert read_task_split(task, "train")[0].tokens == ["fine", "film"]
    record = {"gold_label": "neutral", "sentence1": "A b.", "sentence2": "C d."}
    task = make_task(
        tmp_path,
        "snli",
        "pair",
        {"train": json.dumps(record)},
        reader={"snli_tokenization": "whitespace"},
    )
    assert read_task_split(task, "train")[0] == PairExample(["A", "b."], ["C", "d."], "neutral")


def test_missing_split_is_a_config_error_and_missing_file_a_data_error(tmp_path):
    task = make_task(tmp_path, "label_text", "classification", {"train": "A b\n"})
    with pytest.raises(ConfigError, match="task 't' has no test split"):
        read_task_split(task, "test")
    task = task.model_copy(update={"dev": tmp_path / "absent.txt"})
    with pytest.raises(DataError, match="absent.txt: file not found"):
        read_task_split(task, "dev")


def test_labels_come_from_config_or_sorted_train(tmp_path):
    files = {"train": "b x\na y\nb z\n", "dev": "c w\n"}
    task = make_task(tmp_path, "label_text", "classification", files)
    assert task_labels(task) == ["a", "b"]
    fixed = task.model_copy(update={"labels": ["b", "a"]})
    assert task_labels(fixed) == ["b", "a"]
    with pytest.raises(DataError, match=r"dev.data: labels not in the task's label set.*\['c'\]"):
        check_labels(read_task_split(task, "dev"), task_labels(task))
