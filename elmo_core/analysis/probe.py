"""Linear probes: how much of a tag (POS) each frozen biLM layer holds (Peters et al. 2018, §5.3).

All layers' probes train as one batched einsum; they share nothing and AdamW is elementwise, so
each follows the path it would alone. Features are standardised per layer, so one learning rate
suits every layer.
Shapes: B tokens of a batch, L layers, D layer width, K tags, N tokens of a split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from elmo_core.errors import DataError
from elmo_core.tasks.activation_cache import CachedActivations
from elmo_core.tasks.dataset import Example, TaggingExample, TaskDataset
from elmo_core.tasks.readers import AnyDataset

DEFAULT_EPOCHS = 5  # at least
MIN_UPDATES = 500  # a small tagged set gets more epochs: a probe must converge to be compared
MAX_EPOCHS = 100  # at most, should the training loss keep falling
CONVERGED = 1e-3  # nats per token: an epoch that lowers no layer's loss by this much ends it
DEFAULT_BATCH_SIZE = 256  # tokens
DEFAULT_LR = 1e-3
DEFAULT_WEIGHT_DECAY = 0.01  # AdamW's decoupled decay on the weights, not the biases
DEFAULT_CHUNK_SIZE = 4096  # tokens per read when computing statistics and accuracies
ProbeCallback = Callable[[int, list[float]], None]


class LayerProbes(nn.Module):
    """``L`` independent linear maps, one per layer, over standardised features."""

    mean: torch.Tensor  # buffers, declared for the type checker
    scale: torch.Tensor

    def __init__(self, num_layers: int, layer_dim: int, num_labels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_layers, layer_dim, num_labels))  # (L, D, K)
        self.bias = nn.Parameter(torch.zeros(num_layers, num_labels))  # (L, K)
        self.register_buffer("mean", torch.zeros(num_layers, layer_dim))  # (L, D)
        self.register_buffer("scale", torch.ones(num_layers, layer_dim))  # (L, D): 1 / std

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        """``layers (B, L, D)`` → scores ``(B, L, K)``; layer ``l`` reads ``layers[:, l]`` only."""
        features = (layers - self.mean) * self.scale  # (B, L, D)
        return torch.einsum("bld,ldk->blk", features, self.weight) + self.bias  # (B, L, K)


@dataclass
class ProbeResult:
    """Per-layer accuracies of the probes, and the majority-tag baseline they must beat."""

    train_accuracy: list[float]  # (L,) on the training tokens
    test_accuracy: list[float]  # (L,)
    majority_tag: int  # the most frequent training tag (lowest id on a tie)
    majority_accuracy: float  # on the test tokens, always predicting majority_tag
    history: list[list[float]]  # per epoch, each layer's mean training loss
    num_train_tokens: int
    num_test_tokens: int
    model: LayerProbes

    @property
    def best_layer(self) -> int:
        return int(np.argmax(self.test_accuracy))


def flat_tag_ids(
    dataset: AnyDataset | Sequence[Example], label_ids: Mapping[str, int]
) -> np.ndarray:
    """Every token's tag id, sentence after sentence: the cache's token order. ``(N,)`` int64.

    ``label_ids`` is usually built from the training split, ``{t: i for i, t in
    enumerate(train.labels())}``; a tag outside it (a test tag never seen in training) or an
    untagged example raises :class:`DataError`, naming the file when given a dataset.
    """
    path = dataset.path if isinstance(dataset, TaskDataset) else None
    ids: list[int] = []
    for example in dataset:
        if not isinstance(example, TaggingExample):
            name = type(example).__name__
            raise DataError(f"the probe reads tagged sentences (CoNLL-U), not {name}", path=path)
        for tag in example.tags:
            if tag not in label_ids:
                known = len(label_ids)
                raise DataError(f"tag '{tag}' is not among the probe's {known} tags", path=path)
            ids.append(label_ids[tag])
    return np.array(ids, dtype=np.int64)


def linear_probe(
    train: CachedActivations,
    train_tags: np.ndarray,
    test: CachedActivations,
    test_tags: np.ndarray,
    num_labels: int,
    *,
    seed: int,
    epochs: int = DEFAULT_EPOCHS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    lr: float = DEFAULT_LR,
    weight_decay: float = DEFAULT_WEIGHT_DECAY,
    min_updates: int = MIN_UPDATES,
    max_epochs: int = MAX_EPOCHS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    device: str | torch.device = "cpu",
    progress: ProbeCallback | None = None,
) -> ProbeResult:
    """Train one linear tagger per layer of ``train`` and score each on ``test``: at least
    ``epochs`` epochs, or as many as make ``min_updates`` minibatch updates when that is more,
    then on until an epoch lowers no layer's mean training loss by ``CONVERGED`` (at most
    ``max_epochs``): a probe that stopped while still learning would understate its layer.

    ``progress(epoch, losses)`` is called after each epoch (from 1) with each layer's mean loss.
    """
    train_tags = _check_split(train, train_tags, num_labels, "train")
    test_tags = _check_split(test, test_tags, num_labels, "test")
    if test.activations.shape[1:] != train.activations.shape[1:]:
        raise ValueError(f"test layers {test.activations.shape[1:]} differ from train's")
    device = torch.device(device)
    probes = LayerProbes(train.num_layers, train.layer_dim, num_labels)
    mean, scale = standardisation(train.activations, chunk_size)
    probes.mean.copy_(torch.from_numpy(mean))
    probes.scale.copy_(torch.from_numpy(scale))
    probes.to(device)
    epochs = max(epochs, math.ceil(min_updates / math.ceil(len(train_tags) / batch_size)))
    history = _fit(
        probes,
        train.activations,
        train_tags,
        seed,
        (epochs, max(epochs, max_epochs)),
        batch_size,
        lr,
        weight_decay,
        progress,
    )
    majority = int(np.argmax(np.bincount(train_tags, minlength=num_labels)))
    return ProbeResult(
        train_accuracy=layer_accuracies(probes, train.activations, train_tags, chunk_size),
        test_accuracy=layer_accuracies(probes, test.activations, test_tags, chunk_size),
        majority_tag=majority,
        majority_accuracy=float(np.mean(test_tags == majority)),
        history=history,
        num_train_tokens=len(train_tags),
        num_test_tokens=len(test_tags),
        model=probes.cpu(),
    )


def standardisation(activations: np.ndarray, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and dimension: ``mean (L, D)`` and ``1 / std (L, D)`` (1 where std is ~0)."""
    total = np.zeros(activations.shape[1:], dtype=np.float64)  # (L, D)
    total_sq = np.zeros_like(total)  # (L, D)
    for start in range(0, len(activations), chunk_size):
        chunk = np.asarray(activations[start : start + chunk_size], dtype=np.float32)  # (B, L, D)
        total += chunk.sum(axis=0, dtype=np.float64)
        total_sq += np.square(chunk).sum(axis=0, dtype=np.float64)
    mean = total / len(activations)
    std = np.sqrt(np.maximum(total_sq / len(activations) - np.square(mean), 0.0))
    scale = np.where(std > 1e-6, 1.0 / np.maximum(std, 1e-6), 1.0)
    return mean.astype(np.float32), scale.astype(np.float32)


def layer_accuracies(
    probes: LayerProbes, activations: np.ndarray, tags: np.ndarray, chunk_size: int
) -> list[float]:
    """Each layer's probe accuracy on ``activations (N, L, D)``, read ``chunk_size`` at a time."""
    device = probes.weight.device
    correct = torch.zeros(activations.shape[1], dtype=torch.int64, device=device)  # (L,)
    probes.eval()
    with torch.no_grad():
        for start in range(0, len(activations), chunk_size):
            layers = _read(activations, slice(start, start + chunk_size), device)  # (B, L, D)
            gold = torch.from_numpy(tags[start : start + chunk_size]).to(device)  # (B,)
            predicted = probes(layers).argmax(dim=-1)  # (B, L)
            correct += (predicted == gold[:, None]).sum(dim=0)
    return [int(n) / len(tags) for n in correct.cpu()]


def _fit(
    probes: LayerProbes,
    activations: np.ndarray,
    tags: np.ndarray,
    seed: int,
    epochs: tuple[int, int],
    batch_size: int,
    lr: float,
    weight_decay: float,
    progress: ProbeCallback | None,
) -> list[list[float]]:
    """Epochs of AdamW over shuffled token minibatches (``epochs``: at least, at most; in
    between until the loss stops falling); returns each epoch's per-layer loss."""
    device = probes.weight.device
    groups = [
        {"params": [probes.weight], "weight_decay": weight_decay},
        {"params": [probes.bias], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr)
    shuffler = np.random.default_rng(seed)
    history: list[list[float]] = []
    probes.train()
    least, most = epochs
    for epoch in range(1, most + 1):
        if epoch > least and _converged(history):
            break
        order = shuffler.permutation(len(tags))  # (N,)
        total = torch.zeros(activations.shape[1], dtype=torch.float64, device=device)  # (L,)
        for start in range(0, len(order), batch_size):
            rows = np.sort(order[start : start + batch_size])  # sorted: sequential mmap reads
            layers = _read(activations, rows, device)  # (B, L, D)
            gold = torch.from_numpy(tags[rows]).to(device)  # (B,)
            scores = probes(layers)  # (B, L, K)
            gold_per_layer = gold[:, None].expand(-1, scores.shape[1])  # (B, L)
            losses = nn.functional.cross_entropy(
                scores.transpose(1, 2), gold_per_layer, reduction="none"
            ).mean(dim=0)  # (L,): one independent loss per layer; their sum trains all at once
            optimizer.zero_grad()
            losses.sum().backward()
            optimizer.step()
            total += losses.detach().double() * len(rows)
        history.append([float(x) for x in (total / len(tags)).cpu()])
        if progress is not None:
            progress(epoch, history[-1])
    return history


def _converged(history: list[list[float]]) -> bool:
    """Whether the last epoch lowered no layer's mean training loss by ``CONVERGED`` of it."""
    if len(history) < 2:
        return False
    before, after = history[-2], history[-1]
    return all(old - new < CONVERGED for old, new in zip(before, after, strict=True))


def _read(activations: np.ndarray, rows: slice | np.ndarray, device: torch.device) -> torch.Tensor:
    """Rows of a (memory-mapped, often float16) ``(N, L, D)`` array as float32 on ``device``."""
    return torch.from_numpy(np.asarray(activations[rows], dtype=np.float32)).to(device)


def _check_split(
    cache: CachedActivations, tags: np.ndarray, num_labels: int, name: str
) -> np.ndarray:
    """``tags`` as int64 after checking they are one valid id per cached token."""
    tags = np.asarray(tags, dtype=np.int64)
    if tags.ndim != 1 or len(tags) != len(cache.activations):
        raise ValueError(f"{name}: {tags.shape} tags for {len(cache.activations)} cached tokens")
    if len(tags) == 0:
        raise ValueError(f"{name}: no tokens to probe")
    if tags.min() < 0 or tags.max() >= num_labels:
        raise ValueError(f"{name}: tag ids outside [0, {num_labels})")
    return tags
