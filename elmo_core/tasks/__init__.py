"""Downstream tasks: readers, configs, metrics; scalar-mix adaptation (cache, model, training)."""

from elmo_core.tasks.activation_cache import ActivationCache, CachedActivations, live_activations
from elmo_core.tasks.classification import read_label_text, read_tsv
from elmo_core.tasks.conll import read_conll2003, read_conllu
from elmo_core.tasks.crf import CRF
from elmo_core.tasks.dataset import ClassificationExample, PairExample, TaggingExample, TaskDataset
from elmo_core.tasks.metrics import SpanF1Result, SpanScores, accuracy, span_f1, tags_to_spans
from elmo_core.tasks.readers import check_labels, read_task_split, task_labels
from elmo_core.tasks.snli import read_snli
from elmo_core.tasks.sst import read_sst
from elmo_core.tasks.task_config import (
    HeadConfig,
    TaskConfig,
    TaskTrainingConfig,
    load_task_config,
)
from elmo_core.tasks.task_model import TaskModel, build_word_vocab, example_sentences
from elmo_core.tasks.trainer import TaskResult, TaskSplit, predict, train_task

__all__ = [
    "ActivationCache",
    "CRF",
    "CachedActivations",
    "ClassificationExample",
    "HeadConfig",
    "PairExample",
    "SpanF1Result",
    "SpanScores",
    "TaggingExample",
    "TaskConfig",
    "TaskDataset",
    "TaskModel",
    "TaskResult",
    "TaskSplit",
    "TaskTrainingConfig",
    "accuracy",
    "build_word_vocab",
    "check_labels",
    "example_sentences",
    "live_activations",
    "load_task_config",
    "predict",
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
    "train_task",
]
