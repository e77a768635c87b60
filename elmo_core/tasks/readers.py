"""Read a task's split with the reader its config names, and settle its label set."""

from __future__ import annotations

from elmo_core.errors import ConfigError, DataError
from elmo_core.tasks.classification import read_label_text, read_tsv
from elmo_core.tasks.conll import read_conll2003, read_conllu
from elmo_core.tasks.dataset import (
    ClassificationExample,
    PairExample,
    TaggingExample,
    TaskDataset,
)
from elmo_core.tasks.snli import read_snli
from elmo_core.tasks.sst import read_sst
from elmo_core.tasks.task_config import Split, TaskConfig

AnyDataset = (
    TaskDataset[TaggingExample] | TaskDataset[ClassificationExample] | TaskDataset[PairExample]
)


def read_task_split(task: TaskConfig, split: Split) -> AnyDataset:
    """Read the ``train``, ``dev`` or ``test`` file of ``task`` with its format's reader.

    SST phrase-level examples (``reader.sst_phrases``) are used for ``train`` only; ``dev`` and
    ``test`` are always read as whole sentences, which is how SST results are reported.
    """
    path = task.split_path(split)
    if path is None:
        raise ConfigError(f"task '{task.name}' has no {split} split", key=split)
    options = task.reader
    if task.format == "conll2003":
        return read_conll2003(path, tag_scheme=options.tag_scheme)
    if task.format == "conllu":
        return read_conllu(path, column=options.conllu_column)
    if task.format == "sst":
        return read_sst(path, phrases=options.sst_phrases and split == "train")
    if task.format == "label_text":
        return read_label_text(path)
    if task.format == "tsv":
        return read_tsv(path, label_column=options.tsv_label_column, header=options.tsv_header)
    return read_snli(path, tokenization=options.snli_tokenization)


def task_labels(task: TaskConfig, train: AnyDataset | None = None) -> list[str]:
    """The task's label (or tag) list: ``task.labels`` if given, else the sorted labels of train.

    Pass the already-read ``train`` dataset to avoid reading it twice.
    """
    if task.labels is not None:
        return list(task.labels)
    dataset = train if train is not None else read_task_split(task, "train")
    return dataset.labels()


def check_labels(dataset: AnyDataset, labels: list[str]) -> None:
    """Fail if ``dataset`` holds a label outside ``labels`` (e.g. a dev tag never seen in train)."""
    unknown = sorted(set(dataset.labels()) - set(labels))
    if unknown:
        raise DataError(
            f"labels not in the task's label set {labels}: {unknown}", path=dataset.path
        )
