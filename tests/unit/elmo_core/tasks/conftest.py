"""Fixtures of the adaptation tests: a tiny biLM and tiny synthetic tasks where context matters.

* tagging: ``jordan`` is ``B-PER`` after ``mr`` and ``B-LOC`` after ``in`` (the word alone is
  ambiguous);
* classification: ``pos`` when ``good`` is not preceded by ``not``;
* pair: ``same`` when premise and hypothesis start with the same word;
* parsing: each word hangs on the next, the last on the root; ``the`` and ``a`` as ``det``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from elmo_core.model.bilm import BiLM
from elmo_core.presets import tiny
from elmo_core.tasks.activation_cache import ActivationCache
from elmo_core.tasks.dataset import (
    ClassificationExample,
    PairExample,
    TaggingExample,
    TaskDataset,
)
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.task_model import example_sentences
from elmo_core.tasks.trainer import TaskSplit
from elmo_core.tasks.types.parsing.conllu import ParseExample

FILLER = ["the", "a", "saw", "met", "with", "and", "today", "we"]
SPLIT_SIZES = {"train": 64, "dev": 24, "test": 24}


def _tagging(rng: random.Random) -> TaggingExample:
    tokens: list[str] = []
    tags: list[str] = []
    for _ in range(rng.randint(2, 6)):
        draw = rng.random()
        if draw < 0.25:
            tokens += ["mr", "jordan"]
            tags += ["O", "B-PER"]
        elif draw < 0.5:
            tokens += ["in", "jordan"]
            tags += ["O", "B-LOC"]
        else:
            tokens.append(rng.choice(FILLER))
            tags.append("O")
    return TaggingExample(tokens, tags)


def _classification(rng: random.Random) -> ClassificationExample:
    negated = rng.random() < 0.5
    tokens = [rng.choice(FILLER) for _ in range(rng.randint(0, 3))]
    tokens += ["not", "good"] if negated else ["good"]
    tokens += [rng.choice(FILLER) for _ in range(rng.randint(0, 3))]
    return ClassificationExample(tokens, "neg" if negated else "pos")


def _pair(rng: random.Random) -> PairExample:
    premise = [rng.choice(FILLER) for _ in range(rng.randint(1, 5))]
    same = rng.random() < 0.5
    first = premise[0] if same else rng.choice([w for w in FILLER if w != premise[0]])
    hypothesis = [first] + [rng.choice(FILLER) for _ in range(rng.randint(0, 4))]
    return PairExample(premise, hypothesis, "same" if same else "diff")


def _parse(rng: random.Random) -> ParseExample:
    tokens = [rng.choice(FILLER) for _ in range(rng.randint(1, 7))]
    heads = [*range(2, len(tokens) + 1), 0]
    relations = ["det" if word in ("the", "a") else "dep" for word in tokens[:-1]] + ["root"]
    return ParseExample(tokens, heads, relations)


MAKERS: dict[str, Callable[[random.Random], Any]] = {
    "tagging": _tagging,
    "classification": _classification,
    "pair": _pair,
    "parsing": _parse,
}
FORMATS = {
    "tagging": "conll2003",
    "classification": "label_text",
    "pair": "snli",
    "parsing": "conllu",
}


@pytest.fixture(scope="session")
def tiny_bilm() -> BiLM:
    torch.manual_seed(0)
    return BiLM(tiny()).eval()


def make_task(task_type: str, **head: Any) -> TaskConfig:
    """A task config for the synthetic data (the paths are never read)."""
    training = {"epochs": 3, "batch_size": 16, "lr": 0.02, "patience": 3}
    training |= head.pop("training", {})
    return TaskConfig(
        name=f"toy-{task_type}",
        type=task_type,  # type: ignore[arg-type]
        format=FORMATS[task_type],  # type: ignore[arg-type]
        train=Path("unused"),
        reader={"tag_scheme": "iob2"} if FORMATS[task_type] == "conll2003" else {},
        head={"hidden_dim": 8, "dropout": 0.1, **head},  # type: ignore[arg-type]
        training=training,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def task_splits(
    tiny_bilm: BiLM, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, TaskSplit]]:
    """``{task type: {split: TaskSplit}}`` with float32 caches of the tiny biLM."""
    cache = ActivationCache(tmp_path_factory.mktemp("activations"), dtype="float32")
    rng = random.Random(0)
    splits: dict[str, dict[str, TaskSplit]] = {}
    for task_type, maker in MAKERS.items():
        splits[task_type] = {}
        for name, size in SPLIT_SIZES.items():
            dataset = TaskDataset(Path(name), [maker(rng) for _ in range(size)])
            activations = cache.get_or_build(
                tiny_bilm, example_sentences(dataset.examples), 32, False
            )
            splits[task_type][name] = TaskSplit(dataset, activations)
    return splits


@pytest.fixture(scope="session")
def task_factory() -> Callable[..., TaskConfig]:
    return make_task


@pytest.fixture
def spanish_conllu() -> str:
    """Two CoNLL-U sentences with a multiword token, an empty node and a tree each."""
    return """\
# sent_id = 1
# text = Vámonos al mar.
1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_
1\tVamos\tir\tVERB\tVMM\t_\t0\troot\t_\t_
2\tnos\tnosotros\tPRON\tPP\t_\t1\tobj\t_\t_
3-4\tal\t_\t_\t_\t_\t_\t_\t_\t_
3\ta\ta\tADP\tSPS\t_\t5\tcase\t_\t_
4\tel\tel\tDET\tDA\t_\t5\tdet\t_\t_
5\tmar\tmar\tNOUN\tNC\t_\t1\tobl\t_\tSpaceAfter=No
5.1\tfue\tir\tVERB\tVMI\t_\t_\t_\t0:root\t_
6\t.\t.\tPUNCT\tFp\t_\t1\tpunct\t_\t_

# sent_id = 2
1\tSí\tsí\tINTJ\tRG\t_\t0\troot\t_\t_
"""
