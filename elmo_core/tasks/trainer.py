"""Train a task model on cached biLM activations; evaluate it; predict on new sentences.

The recipe of the paper's task experiments (Peters et al. 2018, §5 and supplement): Adam, dropout
in the head and after the mix, ``λ = 0.001`` on the mix weights, early stopping on the dev score.
Seeded generators in a forked RNG make runs reproducible and leave the caller's RNG untouched.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from elmo_core.tasks.activation_cache import CachedActivations, flat_positions
from elmo_core.tasks.dataset import Example
from elmo_core.tasks.readers import AnyDataset, check_labels, task_labels
from elmo_core.tasks.task_config import Batches, TaskConfig
from elmo_core.tasks.task_model import (
    EncodedSplit,
    MixPosition,
    TaskInputs,
    TaskModel,
    build_word_vocab,
    encode_split,
    example_sentences,
    live_inputs,
    num_sides,
)
from elmo_core.tasks.types import task_type
from elmo_core.tasks.types.base import Prediction

BASELINE = (
    "same head over task-trained word embeddings (training vocabulary, words seen once → OOV), "
    "no ELMo; the paper's baselines used pretrained GloVe vectors, unavailable offline"
)
ELMO = "task-trained word embeddings concatenated with a scalar mix of the frozen biLM's layers"
EVAL_BATCH_TOKENS = 8192  # positions per evaluation batch (length-sorted, so little padding)
EpochCallback = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class TaskSplit:
    """A split's examples and, for the ELMo model, the cached activations of their sentences.

    The cache must have been built over :func:`~elmo_core.tasks.task_model.example_sentences`
    of the same examples (pairs: all premises, then all hypotheses).
    """

    dataset: AnyDataset
    activations: CachedActivations | None = None

    def subset(self, indices: Sequence[int]) -> TaskSplit:
        """Examples ``indices`` of this split, with their sentences' activations."""
        examples = [self.dataset.examples[i] for i in indices]
        dataset = dataclasses.replace(self.dataset, examples=examples)  # type: ignore[arg-type]
        if self.activations is None:
            return TaskSplit(dataset)
        rows = np.asarray(indices, dtype=np.int64)
        # each side's sentences after the last's: for pairs premises first, then hypotheses
        rows = np.concatenate(
            [rows + side * len(self.dataset) for side in range(num_sides(examples))]
        )
        return TaskSplit(dataset, self.activations.select(rows))


@dataclass
class TaskResult:
    """What one training run reports; ``model`` holds the best epoch's weights."""

    task: str
    use_elmo: bool
    representation: str  # BASELINE or ELMO: which input the run used
    metric: str  # "f1" or "accuracy": the dev score early stopping followed
    best_epoch: int
    dev_metrics: dict[str, float]
    test_metrics: dict[str, float]
    history: list[dict[str, float]]
    model: TaskModel
    mix_weights: list[float] | None = None
    gamma: float | None = None
    output_mix_weights: list[float] | None = None
    output_gamma: float | None = None


def main_metric(task: TaskConfig) -> str:
    """The score ``task``'s early stopping follows, as its type says (span ``f1`` for entity
    tags, else ``accuracy``)."""
    return task_type(task.type).main_metric(task)


def train_task(
    task: TaskConfig,
    train: TaskSplit,
    dev: TaskSplit | None,
    test: TaskSplit | None,
    use_elmo: bool,
    seed: int | None = None,
    epoch_callback: EpochCallback | None = None,
    device: str | torch.device = "cpu",
) -> TaskResult:
    """Train ``task``'s model (``use_elmo`` or the baseline) and evaluate its best epoch.

    Without ``dev`` every epoch runs and the last is kept. ``epoch_callback(epoch, metrics)``
    gets ``train_loss``, ``dev_*`` scores and the mix weights after each epoch (from 1).
    """
    seed = task.training.seed if seed is None else seed
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model, splits = build_task_model(task, train, dev, test, use_elmo)
        model.to(device)
        history, best_epoch, dev_metrics = _fit(task, model, splits, seed, epoch_callback, device)
    test_metrics = evaluate_task(model, splits["test"], task, device) if test is not None else {}
    result = TaskResult(
        task.name,
        use_elmo,
        ELMO if use_elmo else BASELINE,
        main_metric(task),
        best_epoch,
        dev_metrics,
        test_metrics,
        history,
        model,
    )
    if model.has_mix("input"):
        result.mix_weights, result.gamma = model.mix_weights(), model.gamma()
    if model.has_mix("output"):
        result.output_mix_weights = model.mix_weights("output")
        result.output_gamma = model.gamma("output")
    return result


def build_task_model(
    task: TaskConfig,
    train: TaskSplit,
    dev: TaskSplit | None,
    test: TaskSplit | None,
    use_elmo: bool,
) -> tuple[TaskModel, dict[str, EncodedSplit]]:
    """The model over train's vocabulary and labels, and every split encoded for batching."""
    labels = task_labels(task, train.dataset)
    label_ids = {label: i for i, label in enumerate(labels)}
    examples: list[Example] = list(train.dataset.examples)
    vocab = build_word_vocab(example_sentences(examples))
    if use_elmo and train.activations is None:
        raise ValueError("the ELMo model needs the cached activations of the training split")
    cache = train.activations
    num_layers, layer_dim = (cache.num_layers, cache.layer_dim) if cache is not None else (0, 0)
    model = TaskModel(task, num_layers, layer_dim, vocab, labels, use_elmo)
    splits = {}
    for name, split in (("train", train), ("dev", dev), ("test", test)):
        if split is not None:
            check_labels(split.dataset, labels)  # a dev tag unseen in train names its file
            activations = split.activations if use_elmo else None
            if use_elmo and activations is None:
                raise ValueError(f"the ELMo model needs the cached activations of {name}")
            splits[name] = encode_split(list(split.dataset.examples), vocab, label_ids, activations)
    return model, splits


def _fit(
    task: TaskConfig,
    model: TaskModel,
    splits: dict[str, EncodedSplit],
    seed: int,
    epoch_callback: EpochCallback | None,
    device: torch.device,
) -> tuple[list[dict[str, float]], int, dict[str, float]]:
    """Epochs of Adam with early stopping on the dev score; leaves the best weights in ``model``
    and returns the history, the best epoch and its dev scores (none without dev).

    Dev is scored at the end of an epoch once ``eval_every`` updates have run since the last
    score (every epoch by default), and at the last epoch: a small training set's many short
    epochs do not each pay for a pass over dev. Only a higher score is an improvement (a tie is
    not), and ``patience`` counts scorings only from the one that completes ``min_updates``
    updates: a model that scores 0 while a small training set's first updates run is not stopped
    before it learns."""
    settings = task.training
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    shuffler = np.random.default_rng(seed)
    metric = main_metric(task)
    history: list[dict[str, float]] = []
    best_score, best_epoch, best_state = -math.inf, 0, copy.deepcopy(model.state_dict())
    best_dev: dict[str, float] = {}
    best_scoring, warm_scoring = 0, 0  # which scoring was best; which completed min_updates
    updates_per_epoch = math.ceil(splits["train"].num_examples / settings.batch_size)
    interval = settings.eval_every or 1
    updates, scored_at, losses = 0, 0, []
    for epoch in range(1, settings.epochs + 1):
        batches = epoch_batches(splits["train"], settings.batch_size, settings.batches, shuffler)
        losses.append(train_epoch(model, optimizer, splits["train"], batches))
        updates += updates_per_epoch
        if updates - scored_at < interval and epoch < settings.epochs:
            continue
        scored_at = updates
        metrics = {"train_loss": float(np.mean(losses))}
        losses = []
        dev_scores = evaluate_task(model, splits["dev"], task, device) if "dev" in splits else {}
        metrics |= {f"dev_{name}": value for name, value in dev_scores.items()}
        metrics |= _mix_metrics(model)
        history.append({"epoch": float(epoch), "updates": float(updates), **metrics})
        if epoch_callback is not None:
            epoch_callback(epoch, metrics)
        scoring = len(history)
        if not warm_scoring and updates >= settings.min_updates:
            warm_scoring = scoring
        score = metrics.get(f"dev_{metric}", float(epoch))  # no dev: the last epoch is best
        if score > best_score:
            best_score, best_epoch, best_state = score, epoch, copy.deepcopy(model.state_dict())
            best_scoring, best_dev = scoring, dev_scores
        elif (
            settings.patience is not None
            and warm_scoring
            and (scoring - max(best_scoring, warm_scoring) >= settings.patience)
        ):
            break
    model.load_state_dict(best_state)
    return history, best_epoch, best_dev


def epoch_batches(
    split: EncodedSplit, batch_size: int, how: Batches, rng: np.random.Generator
) -> list[np.ndarray]:
    """One epoch's batches of example indices, in the order they train. ``bucketed``: sorted by
    length with ±10 % noise (so neighbours in length do not always share a batch), cut into
    batches, the batches shuffled; a padded batch then holds little padding, which a CPU's LSTM
    computes (benchmarks/results/task_lstm-2026-11-29.md). ``random``: a shuffled order cut."""
    if how == "random":
        order = rng.permutation(split.num_examples)
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    noisy = split.lengths() * rng.uniform(0.9, 1.1, split.num_examples)
    order = np.argsort(noisy, kind="stable")
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def train_epoch(
    model: TaskModel,
    optimizer: torch.optim.Optimizer,
    split: EncodedSplit,
    batches: Sequence[np.ndarray],
) -> float:
    """One pass over ``split``'s ``batches`` of example indices; returns the mean batch loss."""
    device = next(model.parameters()).device
    model.train()
    losses = []
    for rows in batches:
        sides, targets = split.batch(rows)
        sides = [_to(side, device) for side in sides]
        loss = model.loss(model(sides), targets.to(device), sides)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses))


def evaluate_task(
    model: TaskModel, split: EncodedSplit, task: TaskConfig, device: torch.device
) -> dict[str, float]:
    """Scores of ``model`` on an encoded split, as its type scores: accuracy, and span P/R/F1
    (per type too) for entity tags.

    Examples go in length order, ``EVAL_BATCH_TOKENS`` positions a batch, so batches are large
    and hold little padding; the predictions are compared with the split's label ids as arrays.
    """
    predicted = predict_ids(model, split, device)  # (N,) per token or (B,) per example
    sentences = split.offsets[: split.num_examples + 1]
    return task_type(task.type).scores(task, model.labels, split.targets, predicted, sentences)


def predict_ids(model: TaskModel, split: EncodedSplit, device: torch.device) -> np.ndarray:
    """The label ids ``model`` predicts for an encoded split, aligned with ``split.targets``."""
    model.eval()
    predicted = np.zeros_like(split.targets)
    for rows in split.length_batches(EVAL_BATCH_TOKENS):
        sides, _ = split.batch(rows)
        sides = [_to(side, device) for side in sides]
        with torch.no_grad():
            decoded = model.decode(model(sides), sides).cpu()  # (B, T) or (B,)
        if not split.per_token:
            predicted[rows] = decoded.numpy()
            continue
        starts, lengths = split.offsets[rows], split.offsets[rows + 1] - split.offsets[rows]
        predicted[flat_positions(starts, lengths)] = decoded[sides[0].mask.cpu()].numpy()
    return predicted


def predict(
    model: TaskModel,
    sentences: Sequence[list[str]] | Sequence[tuple[list[str], list[str]]],
    bilm: nn.Module | None = None,
    batch_size: int = 64,
) -> list[Prediction]:
    """Labels (tag lists for tagging) of raw token lists, or of (premise, hypothesis) pairs.

    The ELMo model takes its layers from a live pass of ``bilm`` (the one its cache came from);
    :func:`~elmo_core.tasks.activation_cache.live_activations` also built that cache, so the
    inputs are those training saw (up to the cache's float16 rounding).
    """
    device = next(model.parameters()).device
    predictions: list[Prediction] = []
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start : start + batch_size]
        sides = [live_inputs(model, tokens, bilm) for tokens in _sides(model, chunk)]
        predictions += _predict_batch(model, [_to(side, device) for side in sides])
    return predictions


def _sides(
    model: TaskModel, chunk: Sequence[list[str]] | Sequence[tuple[list[str], list[str]]]
) -> list[list[list[str]]]:
    """The token lists of each side: pairs split into premises and hypotheses."""
    if not task_type(model.task.type).sides:
        return [[list(cast(list[str], tokens)) for tokens in chunk]]
    pairs = cast(Sequence[tuple[list[str], list[str]]], chunk)
    return [[list(a) for a, _ in pairs], [list(b) for _, b in pairs]]


def _predict_batch(model: TaskModel, sides: list[TaskInputs]) -> list[Prediction]:
    model.eval()
    with torch.no_grad():
        decoded = model.decode(model(sides), sides).cpu()
    return _label_strings(model, decoded, sides[0].mask.cpu() if decoded.dim() == 2 else None)


def _label_strings(
    model: TaskModel, ids: torch.Tensor, mask: torch.Tensor | None
) -> list[Prediction]:
    """Label ids → strings: per example (B,), or per real token of each row (B, T)."""
    if mask is None:
        return [model.labels[i] for i in ids.tolist()]
    lengths = mask.sum(dim=1).tolist()
    kind = task_type(model.task.type)
    rows = zip(ids.tolist(), lengths, strict=True)
    return [kind.token_labels(row[:n], model.labels) for row, n in rows]


def _mix_metrics(model: TaskModel) -> dict[str, float]:
    """``mix_weight_j``, ``gamma`` (and ``output_*``) for per-epoch logging."""
    metrics: dict[str, float] = {}
    positions: tuple[tuple[MixPosition, str], ...] = (("input", ""), ("output", "output_"))
    for position, prefix in positions:
        if model.has_mix(position):
            weights = model.mix_weights(position)
            metrics |= {f"{prefix}mix_weight_{j}": w for j, w in enumerate(weights)}
            metrics[f"{prefix}gamma"] = model.gamma(position)
    return metrics


def _to(side: TaskInputs, device: torch.device) -> TaskInputs:
    layers = side.layers.to(device) if side.layers is not None else None
    return TaskInputs(side.word_ids.to(device), side.mask.to(device), layers)
