"""The task model: scalar mix of frozen biLM layers, word embeddings, head (Peters et al. 2018).

The biLM's layers arrive as a tensor (from the activation cache or a live pass), so the biLM is
never in the training graph; a split is held as flat arrays aligned with the cache's ``offsets``,
so a batch is one vectorised gather.
Shapes: B rows, T tokens, L layers, D layer width (2P), E word embedding width, K labels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import nn

from elmo_core.errors import ConfigError
from elmo_core.model.scalar_mix import ScalarMix
from elmo_core.tasks.activation_cache import CachedActivations, live_activations, pad_ragged
from elmo_core.tasks.dataset import Example
from elmo_core.tasks.heads import HeadInput
from elmo_core.tasks.task_config import TaskConfig
from elmo_core.tasks.types import task_type

PADDING_TOKEN = "@@PADDING@@"  # id 0
OOV_TOKEN = "@@UNKNOWN@@"  # id 1
DEFAULT_WORD_DIM = 100
MIX_L2 = 0.001  # λ on the mix weights (paper §3.2)
MixPosition = Literal["input", "output"]


def build_word_vocab(sentences: Iterable[Sequence[str]], min_count: int = 2) -> dict[str, int]:
    """Word → id for the task-trained embeddings: padding 0, OOV 1, then by descending count.

    Words seen fewer than ``min_count`` times map to OOV, so the OOV vector is trained on the
    rare words of the training set and is meaningful for the unseen words of dev and test.
    """
    counts = Counter(token for tokens in sentences for token in tokens)
    kept = sorted((word for word, n in counts.items() if n >= min_count), key=lambda w: -counts[w])
    return {PADDING_TOKEN: 0, OOV_TOKEN: 1} | {word: i + 2 for i, word in enumerate(kept)}


def example_sentences(examples: Sequence[Example]) -> list[list[str]]:
    """The sentences of a split in cache order, side by side: one per example, or for pairs all
    premises, then all hypotheses."""
    sides = [example.sides() for example in examples]
    return [tokens[side] for side in range(num_sides(examples)) for tokens in sides]


def num_sides(examples: Sequence[Example]) -> int:
    """The sentences each example holds: 2 for a pair, else 1."""
    return len(examples[0].sides()) if examples else 1


class TaskInputs(NamedTuple):
    """One sentence side of a batch: ``word_ids``, ``mask`` (B, T), ``layers (L, B, T, D)``."""

    word_ids: torch.Tensor
    mask: torch.Tensor
    layers: torch.Tensor | None = None


@dataclass(frozen=True)
class EncodedSplit:
    """A split as flat arrays: word ids per token, targets per token (tags, heads with their
    relations) or per example."""

    word_ids: np.ndarray  # (N,) int64, sentence s at offsets[s]:offsets[s + 1]
    offsets: np.ndarray  # (S + 1,) with S = num_sides · num_examples
    targets: np.ndarray  # (N,) per token, else (num_examples,) label ids
    num_examples: int
    num_sides: int
    per_token: bool
    activations: CachedActivations | None = None

    def lengths(self) -> np.ndarray:
        """Each example's length in tokens, its longer side for pairs → (num_examples,)."""
        return np.diff(self.offsets).reshape(self.num_sides, self.num_examples).max(axis=0)

    def length_batches(self, max_positions: int) -> list[np.ndarray]:
        """Every example once, shortest first, in batches of at most ``max_positions`` padded
        positions (a longer example alone): evaluation order, where order does not matter."""
        lengths = self.lengths()
        order = np.argsort(lengths, kind="stable")  # (num_examples,)
        batches, start = [], 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * max(lengths[order[end]], 1) <= (
                max_positions
            ):
                end += 1
            batches.append(order[start:end])
            start = end
        return batches

    def batch(self, indices: np.ndarray) -> tuple[list[TaskInputs], torch.Tensor]:
        """Examples ``indices`` → one :class:`TaskInputs` per side, ``targets (B, T)`` or (B,)."""
        sides = []
        for side in range(self.num_sides):
            sentences = indices + side * self.num_examples  # (B,)
            word_ids, mask = pad_ragged(self.word_ids, self.offsets, sentences)  # (B, T)
            layers = None
            if self.activations is not None:
                layers, _ = self.activations.batch(sentences)  # (L, B, T, D)
            sides.append(TaskInputs(torch.from_numpy(word_ids), torch.from_numpy(mask), layers))
        if not self.per_token:
            return sides, torch.from_numpy(self.targets[indices])  # (B,)
        tags, _ = pad_ragged(self.targets, self.offsets, indices)  # (B, T)
        return sides, torch.from_numpy(tags)


def encode_split(
    examples: Sequence[Example],
    vocab: Mapping[str, int],
    label_ids: Mapping[str, int],
    activations: CachedActivations | None = None,
) -> EncodedSplit:
    """Look every token and label up once, so that batches need no per-token Python work."""
    sentences = example_sentences(examples)
    lengths = np.array([len(tokens) for tokens in sentences], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    oov = vocab[OOV_TOKEN]
    word_ids = np.array([vocab.get(t, oov) for s in sentences for t in s], dtype=np.int64)
    per_token = bool(examples) and examples[0].per_token
    ids = [target for example in examples for target in example.target_ids(label_ids)]
    targets = np.array(ids, dtype=np.int64)
    if activations is not None and not np.array_equal(activations.offsets, offsets):
        raise ValueError("the cached activations were built for other sentences")
    return EncodedSplit(
        word_ids, offsets, targets, len(examples), num_sides(examples), per_token, activations
    )


def live_inputs(
    model: TaskModel, sentences: Sequence[list[str]], bilm: nn.Module | None
) -> TaskInputs:
    """One side of a batch from raw tokens: word ids, and biLM layers computed now."""
    oov = model.vocab[OOV_TOKEN]
    width = max((len(tokens) for tokens in sentences), default=0)
    word_ids = torch.zeros(len(sentences), width, dtype=torch.long)  # (B, T)
    for row, tokens in enumerate(sentences):
        word_ids[row, : len(tokens)] = torch.tensor([model.vocab.get(t, oov) for t in tokens])
    mask = torch.arange(width) < torch.tensor([len(t) for t in sentences]).unsqueeze(1)  # (B, T)
    if not model.use_elmo:
        return TaskInputs(word_ids, mask)
    if bilm is None:
        raise ValueError("the ELMo model needs the biLM to predict new sentences")
    layers, _ = live_activations(bilm, sentences)  # (L, B, T, D)
    return TaskInputs(word_ids, mask, layers.cpu())


class TaskModel(nn.Module):
    """``[word embedding; γ·Σ softmax(w)_j h_j]`` → task head; ``use_elmo=False``: the baseline."""

    def __init__(
        self,
        task: TaskConfig,
        num_layers: int,
        layer_dim: int,
        vocab: Mapping[str, int],
        labels: Sequence[str],
        use_elmo: bool,
        *,
        word_dim: int = DEFAULT_WORD_DIM,
    ) -> None:
        super().__init__()
        self.task = task
        self.vocab = dict(vocab)
        self.labels = list(labels)
        self.use_elmo = use_elmo
        self.num_layers = num_layers
        self.layer_dim = layer_dim
        self.layers = task.head.elmo_layers or list(range(num_layers))  # the ones mixed
        if use_elmo and max(self.layers) >= num_layers:
            raise ConfigError(
                f"the biLM has layers 0-{num_layers - 1}, not {max(self.layers)}",
                key="head.elmo_layers",
            )
        self.word_embedding = nn.Embedding(len(self.vocab), word_dim, padding_idx=0)
        self.mixes = nn.ModuleDict()
        if use_elmo:
            norm = task.head.elmo_layer_norm
            self.mixes["input"] = ScalarMix(len(self.layers), do_layer_norm=norm)
            if task.head.elmo_at_output:
                self.mixes["output"] = ScalarMix(len(self.layers), do_layer_norm=norm)
        self.elmo_dropout = nn.Dropout(task.head.dropout)  # after the mix, as in the paper
        input_dim = word_dim + (layer_dim if use_elmo else 0)
        output_dim = layer_dim if "output" in self.mixes else 0
        self.head = task_type(task.type).head(input_dim, len(self.labels), task.head, output_dim)

    def forward(self, sides: Sequence[TaskInputs]) -> torch.Tensor:
        """Per-token tag scores ``(B, T, K)`` (tagging) or label scores ``(B, K)``."""
        return self.head([self._head_input(side) for side in sides])

    def loss(
        self, scores: torch.Tensor, targets: torch.Tensor, sides: Sequence[TaskInputs]
    ) -> torch.Tensor:
        """The head's loss plus ``λ‖w‖²`` on each mix's weights (λ = 0.001, paper §3.2)."""
        loss = self.head.loss(scores, targets, sides[0].mask)
        for mix in self.mixes.values():
            assert isinstance(mix, ScalarMix)
            loss = loss + mix.l2_penalty(MIX_L2)
        return loss

    def decode(self, scores: torch.Tensor, sides: Sequence[TaskInputs]) -> torch.Tensor:
        """Predicted label ids: ``(B, T)`` for tagging (0 at padding), else ``(B,)``."""
        return self.head.decode(scores, sides[0].mask)

    def mix_weights(self, position: MixPosition = "input") -> list[float]:
        """The softmax-normalised layer weights of a mix (for logging)."""
        return [float(w) for w in self._mix(position).weights().detach()]

    def gamma(self, position: MixPosition = "input") -> float:
        """The scale γ of a mix (for logging)."""
        return float(self._mix(position).gamma.detach())

    def has_mix(self, position: MixPosition) -> bool:
        return position in self.mixes

    def _mix(self, position: MixPosition) -> ScalarMix:
        if position not in self.mixes:
            raise ValueError(f"this model has no {position} ELMo mix (use_elmo={self.use_elmo})")
        mix = self.mixes[position]
        assert isinstance(mix, ScalarMix)
        return mix

    def _head_input(self, side: TaskInputs) -> HeadInput:
        words = self.word_embedding(side.word_ids)  # (B, T, E)
        if not self.use_elmo:
            return HeadInput(words, side.mask)
        if side.layers is None:
            raise ValueError("the ELMo model needs the biLM layers of every batch")
        layers = [side.layers[layer] for layer in self.layers]  # L' × (B, T, D)
        mask_3d = side.mask.unsqueeze(-1).to(words.dtype)  # (B, T, 1)
        elmo = self.elmo_dropout(self._mix("input")(layers, side.mask)) * mask_3d  # (B, T, D)
        output_elmo = None
        if "output" in self.mixes:
            output_elmo = self.elmo_dropout(self._mix("output")(layers, side.mask)) * mask_3d
        return HeadInput(torch.cat([words, elmo], dim=-1), side.mask, output_elmo)  # (B, T, E+D)
