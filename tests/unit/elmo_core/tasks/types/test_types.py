"""What every registered task type must do, checked for each (a new type adds its sample file and
head options here, and its examples to ``tests/unit/elmo_core/tasks/conftest.py``); the registry;
and the rule that no code outside the types tests a type's name."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from elmo_core.errors import ConfigError
from elmo_core.tasks.heads import HeadInput
from elmo_core.tasks.readers import read_task_split, task_labels
from elmo_core.tasks.task_config import HeadConfig, TaskConfig, load_task_config
from elmo_core.tasks.trainer import TaskSplit, main_metric, predict, train_task
from elmo_core.tasks.types import TASK_TYPES, task_type
from pipelines.serving.task_pyfunc import model_signature

REPO = Path(__file__).resolve().parents[5]
SAMPLES = {  # type: (format, file text) of two examples
    "tagging": ("conll2003", "EU B-ORG\nrejects O\n\nPeter B-PER\nwins O\n"),
    "classification": ("label_text", "pos a good film\nneg not good at all\n"),
    "pair": (
        "snli",
        '{"gold_label": "neutral", "sentence1": "A man sleeps .", "sentence2": "He dreams ."}\n'
        '{"gold_label": "entailment", "sentence1": "Two dogs run .", "sentence2": "Dogs run ."}\n',
    ),
    "parsing": (
        "conllu",
        "1\tDogs\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_\n2\tbark\t_\tVERB\t_\t_\t0\troot\t_\t_\n\n"
        "1\tRun\t_\tVERB\t_\t_\t0\troot\t_\t_\n2\t!\t_\tPUNCT\t_\t_\t1\tpunct\t_\t_\n",
    ),
}
HEAD_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "tagging": [{}, {"crf": True}],
    "classification": [{"pooling": "max"}, {"pooling": "mean"}],
    "pair": [{"pair_head": "esim"}, {"pair_head": "match"}],
    "parsing": [{}],
}
VARIANTS = [(name, options) for name in TASK_TYPES for options in HEAD_OPTIONS.get(name, [{}])]


def test_every_registered_type_has_a_sample_head_options_and_synthetic_examples(
    task_splits: dict[str, dict[str, TaskSplit]],
) -> None:
    assert set(SAMPLES) == set(HEAD_OPTIONS) == set(task_splits) == set(TASK_TYPES)


def test_an_unknown_type_is_refused_with_the_registered_types(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text("name: t\ntype: parse\nformat: conllu\ntrain: t.txt\n")
    with pytest.raises(
        ConfigError, match="the registered types are tagging, classification, pair, parsing"
    ):
        load_task_config(tmp_path / "task.yaml")


@pytest.mark.parametrize("name", list(TASK_TYPES))
def test_a_type_reads_its_sample_and_refuses_formats_it_does_not_read(
    name: str, tmp_path: Path
) -> None:
    kind = task_type(name)
    form, text = SAMPLES[name]
    (tmp_path / "train.txt").write_text(text)
    task = load_task_config(_task_file(tmp_path, name, form))
    dataset = read_task_split(task, "train")
    assert len(dataset) == 2 and task_labels(task, dataset)
    assert [kind.text_columns(example) for example in dataset]  # text for the served model
    others = {f.name for other in TASK_TYPES.values() for f in other.formats} - {
        f.name for f in kind.formats
    }
    for other in sorted(others):
        with pytest.raises(ConfigError, match=f"is not one a {name} task reads"):
            load_task_config(_task_file(tmp_path, name, other))


@pytest.mark.parametrize(("name", "options"), VARIANTS)
def test_scores_do_not_depend_on_padding(name: str, options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    kind = task_type(name)
    head = kind.head(5, 3, HeadConfig(hidden_dim=4, **options), 0).eval()
    sides = [_side([4, 2, 3], seed) for seed in range(len(kind.sides) or 1)]
    scores = head(sides)
    repadded = head([_repadded(side, 7) for side in sides])
    assert scores.shape[0] == 3
    real = tuple(slice(0, size) for size in scores.shape[1:])  # more padding: more positions
    torch.testing.assert_close(repadded[(slice(None), *real)], scores)


@pytest.mark.parametrize("name", list(TASK_TYPES))
def test_a_type_trains_scores_predicts_serves_and_analyses_its_errors(
    name: str,
    task_splits: dict[str, dict[str, TaskSplit]],
    tiny_bilm: torch.nn.Module,
    task_factory: Callable[..., TaskConfig],
) -> None:
    kind = task_type(name)
    task = task_factory(name, training={"epochs": 1})
    splits = task_splits[name]
    result = train_task(task, splits["train"], splits["dev"], splits["test"], use_elmo=True)
    assert main_metric(task) in result.test_metrics and result.metric == main_metric(task)

    examples = list(splits["test"].dataset.examples)
    rows = [_tokens(example) for example in examples]
    predicted = predict(result.model, rows, tiny_bilm)
    gold = [kind.gold(example) for example in examples]
    assert [_shape(p) for p in predicted] == [_shape(g) for g in gold]

    signature = model_signature(name)
    assert signature.inputs.input_names() == [column.name for column in kind.inputs()]
    assert signature.outputs.input_names() == [column.name for column in kind.outputs()]
    firsts = [row[0] if isinstance(row, tuple) else row for row in rows]
    assert list(kind.output_rows(firsts, predicted)) == signature.outputs.input_names()
    assert set(kind.text_columns(examples[0])) <= set(signature.inputs.input_names())

    tables = kind.error_tables(task, result.model.labels, gold, predicted)
    assert tables.per_type is not None or tables.confusion is not None
    if tables.confusion is not None:
        assert tables.confusion.sum() == len(examples)


def test_no_code_outside_the_types_tests_a_types_name() -> None:
    """A branch on ``task.type == "tagging"`` outside ``elmo_core/tasks/types`` is what a new
    type would have to find and edit: every string equal to a registered type's name is refused
    there."""
    types_dir = REPO / "elmo_core" / "tasks" / "types"
    found = []
    for root in ("elmo_core", "pipelines", "flows"):
        for path in sorted((REPO / root).rglob("*.py")):
            if types_dir in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in TASK_TYPES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert found == []


def _task_file(root: Path, name: str, form: str) -> Path:
    path = root / f"{name}-{form}.yaml"
    path.write_text(f"name: t\ntype: {name}\nformat: {form}\ntrain: train.txt\n")
    return path


def _side(lengths: list[int], seed: int) -> HeadInput:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(len(lengths), max(lengths), 5, generator=generator)
    mask = torch.arange(max(lengths)) < torch.tensor(lengths).unsqueeze(1)
    return HeadInput(inputs * mask.unsqueeze(-1), mask)


def _repadded(side: HeadInput, width: int) -> HeadInput:
    """The same rows with more padding (garbage in the padded inputs)."""
    extra = width - side.inputs.shape[1]
    inputs = torch.cat([side.inputs, torch.full((len(side.inputs), extra, 5), 9.0)], 1)
    mask = torch.cat([side.mask, torch.zeros(len(side.mask), extra, dtype=torch.bool)], 1)
    return HeadInput(inputs, mask)


def _tokens(example: Any) -> Any:
    return (example.premise, example.hypothesis) if hasattr(example, "premise") else example.tokens


def _shape(prediction: Any) -> Any:
    return len(prediction) if isinstance(prediction, list) else "one label"
