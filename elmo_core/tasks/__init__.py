"""Downstream tasks: readers, configs and metrics for scalar-mix adaptation."""

from elmo_core.tasks.classification import read_label_text, read_tsv
from elmo_core.tasks.config import (
    HeadConfig,
    ReaderConfig,
    TaskConfig,
    TaskTrainingConfig,
    load_task_config,
)
from elmo_core.tasks.conll import read_conll2003, read_conllu
from elmo_core.tasks.dataset import ClassificationExample, PairExample, TaggingExample, TaskDataset
from elmo_core.tasks.metrics import SpanF1Result, SpanScores, accuracy, span_f1, tags_to_spans
from elmo_core.tasks.readers import check_labels, read_task_split, task_labels
from elmo_core.tasks.snli import read_snli
from elmo_core.tasks.sst import read_sst

__all__ = [
    "ClassificationExample",
    "HeadConfig",
    "PairExample",
    "ReaderConfig",
    "SpanF1Result",
    "SpanScores",
    "TaggingExample",
    "TaskConfig",
    "TaskDataset",
    "TaskTrainingConfig",
    "accuracy",
    "check_labels",
    "load_task_config",
    "read_conll2003",
    "read_conllu",
    "read_label_text",
    "read_snli",
    "read_sst",
    "read_task_split",
    "read_tsv",
    "span_f1",
    "tags_to_spans",
    "task_labels",
]
