import pytest

from elmo_core.errors import ConfigError
from elmo_core.tasks.task_config import TaskConfig, load_task_config

NER_YAML = """\
name: conll2003-ner
type: tagging
format: conll2003
train: data/eng.train
dev: data/eng.testa
test: /abs/eng.testb
reader:
  tag_scheme: iob1
head:
  hidden_dim: 64
  crf: true
training:
  epochs: 2
  patience: null
"""


def write(tmp_path, text, name="task.yaml"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_loads_task_and_resolves_relative_paths_against_the_yaml(tmp_path, monkeypatch):
    path = write(tmp_path / "tasks" / "ner", NER_YAML)
    monkeypatch.chdir(tmp_path)
    task = load_task_config(path.relative_to(tmp_path))
    assert task.train == tmp_path / "tasks" / "ner" / "data" / "eng.train"
    assert task.dev == tmp_path / "tasks" / "ner" / "data" / "eng.testa"
    assert str(task.test) == "/abs/eng.testb"
    assert task.head.crf and task.head.hidden_dim == 64
    assert task.head.pooling == "max"  # default
    assert task.training.epochs == 2 and task.training.patience is None
    assert task.labels is None


def test_override_paths_are_relative_to_the_current_directory(tmp_path, monkeypatch):
    path = write(tmp_path / "tasks", NER_YAML)
    monkeypatch.chdir(tmp_path)
    task = load_task_config(path, ["dev=mine/dev.txt", "training.lr=0.01"])
    assert task.dev == tmp_path / "mine" / "dev.txt"
    assert task.train == tmp_path / "tasks" / "data" / "eng.train"
    assert task.training.lr == 0.01


def test_unknown_key_fails_with_its_dotted_path(tmp_path):
    path = write(tmp_path, NER_YAML.replace("hidden_dim", "hiden_dim"))
    with pytest.raises(ConfigError, match=r"task.yaml, key 'head.hiden_dim'"):
        load_task_config(path)
    path = write(tmp_path, NER_YAML + "epochs: 3\n")
    with pytest.raises(ConfigError, match=r"key 'epochs'"):
        load_task_config(path)


def test_closed_choices_are_checked(tmp_path):
    path = write(tmp_path, NER_YAML.replace("iob1", "bioes"))
    with pytest.raises(ConfigError, match=r"key 'reader.tag_scheme'"):
        load_task_config(path)
    with pytest.raises(ConfigError, match=r"key 'format'"):
        load_task_config(write(tmp_path, NER_YAML.replace("format: conll2003", "format: csv")))


def test_a_reader_option_of_another_format_is_refused_by_its_key(tmp_path):
    path = write(tmp_path, NER_YAML)
    with pytest.raises(ConfigError, match=r"key 'reader.sst_phrases'.*format conll2003"):
        load_task_config(path, ["reader.sst_phrases=true"])
    assert load_task_config(path).model_dump(mode="json")["reader"] == {"tag_scheme": "iob1"}


def test_format_must_match_type_and_crf_is_for_tagging():
    base = {"name": "sst5", "train": "t.txt"}
    with pytest.raises(
        ValueError, match=r"format 'sst' is not one a tagging task reads \(conll2003, conllu\)"
    ):
        TaskConfig.model_validate({**base, "type": "tagging", "format": "sst"})
    with pytest.raises(ValueError, match="head.crf does not apply to a classification task"):
        TaskConfig.model_validate(
            {**base, "type": "classification", "format": "sst", "head": {"crf": True}}
        )
    with pytest.raises(ValueError, match="labels must be unique"):
        TaskConfig.model_validate(
            {**base, "type": "classification", "format": "sst", "labels": ["0", "0"]}
        )


def test_name_is_usable_as_a_model_name():
    with pytest.raises(ValueError, match="name"):
        TaskConfig.model_validate(
            {"name": "My Task", "type": "pair", "format": "snli", "train": "t.jsonl"}
        )


def test_format_type_mismatch_names_the_format_key(tmp_path):
    path = write(tmp_path, NER_YAML.replace("format: conll2003", "format: snli"))
    with pytest.raises(ConfigError, match=r"key 'format'.*format 'snli' is not one a tagging task"):
        load_task_config(path)
