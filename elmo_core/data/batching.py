"""Stream batching of bilm-tf: B independent rows of sentences cut into windows of T tokens.

Each row pulls its next sentence from one shared source when it runs out and keeps its LSTM state
across windows, as bilm-tf's ``_get_batch`` does. Unlike bilm-tf, rows pull in time order, so the
streams do not depend on T: an evaluation with T = 20 scores bilm-tf's one-token-per-step test.
Shapes: B rows, T window, W chars per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from elmo_core.config import TrainConfig
from elmo_core.data.manifest import Manifest, load_manifest
from elmo_core.data.reader import ReadUnit, SentenceBatch, partition_split, read_unit, select_shards
from elmo_core.errors import DataError

__all__ = ["TokenStream", "Window", "training_steps", "window_char_ids"]

BOS_ID = 0  # <S>: word-type id and vocabulary id (elmo_core.data.shards)
EOS_ID = 1  # </S>
NO_TOKEN = -1


@dataclass(frozen=True)
class Window:
    """One step of every row: what the model reads and what it must predict."""

    inputs: np.ndarray  # (B, T) int64 word-type ids; -1 = no token
    targets: np.ndarray  # (B, T) int64 vocabulary ids (OOV → 2 <UNK>); -1 = not scored

    @property
    def num_tokens(self) -> int:
        """Scored positions in the window."""
        return int((self.targets >= 0).sum())


def training_steps(manifest: Manifest, train: TrainConfig, world_size: int) -> int:
    """Global optimiser steps: ``epochs`` passes over the manifest's training tokens.

    ``ceil(tokens × epochs / (B × T × world_size))``, capped by ``max_steps`` (bilm-tf derives
    ``n_batches_total`` from ``n_train_tokens`` the same way).
    """
    tokens_per_step = train.batch_size * train.unroll_steps * world_size
    steps = max(1, math.ceil(manifest.split("train").num_tokens * train.epochs / tokens_per_step))
    return min(steps, train.max_steps) if train.max_steps is not None else steps


def window_char_ids(inputs: np.ndarray, char_table: np.ndarray) -> np.ndarray:
    """``inputs (B, T)`` type ids → ``(B, T, W)`` char ids, all zero (padding) where ``-1``."""
    chars = char_table[np.maximum(inputs, 0)]  # (B, T, W)
    chars[inputs < 0] = 0
    return chars


class _SentenceSource:
    """This rank's sentences in (possibly shuffled) order; its position is three integers."""

    def __init__(
        self,
        dataset_url: str,
        units: list[ReadUnit],
        files: Sequence[str] | None,
        *,
        vocab_size: int,
        seed: int,
        shuffle: bool,
        repeat: bool,
    ) -> None:
        self._url, self._files, self._vocab_size = dataset_url, files, vocab_size
        self._units, self._seed, self._shuffle, self._repeat = units, seed, shuffle, repeat
        self.epoch, self.unit, self.sentence = 0, 0, 0
        self._batch: SentenceBatch | None = None
        self._order: np.ndarray | None = None

    def position(self) -> tuple[int, int, int]:
        return self.epoch, self.unit, self.sentence

    def seek(self, epoch: int, unit: int, sentence: int) -> None:
        self.epoch, self.unit, self.sentence = epoch, unit, sentence
        self._batch = self._order = None

    def next_sentence(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(types, targets)`` of the next sentence, or None when a single pass has ended."""
        while self._order is None or self.sentence >= len(self._order):
            if self._order is not None:
                self.unit, self.sentence = self.unit + 1, 0
            if self.unit >= len(self._units):
                if not self._repeat or not self._units:
                    return None
                self.epoch, self.unit = self.epoch + 1, 0
            self._load_unit()
        assert self._batch is not None
        index = int(self._order[self.sentence])
        self.sentence += 1
        start, end = self._batch.offsets[index], self._batch.offsets[index + 1]
        return self._batch.types[start:end], self._batch.targets[start:end]

    def _load_unit(self) -> None:
        unit_order = np.arange(len(self._units))
        if self._shuffle:
            unit_order = np.random.default_rng([self._seed, self.epoch]).permutation(unit_order)
        position = int(unit_order[self.unit])
        self._batch = read_unit(
            self._url, self._units[position], self._files, vocab_size=self._vocab_size
        )
        count = self._batch.num_sentences
        if self._shuffle:
            rng = np.random.default_rng([self._seed, self.epoch, position])
            self._order = rng.permutation(count)
        else:
            self._order = np.arange(count)


class TokenStream:
    """B rows of one direction's sentence stream, cut into :class:`Window` s of T tokens.

    ``next_window`` returns None only when ``repeat=False`` and every row is exhausted; rows that
    ran out before then are padded with -1, so the last windows may be partial.
    ``state_dict``/``load_state_dict`` resume exactly where the stream stopped.
    """

    def __init__(
        self,
        dataset_url: str,
        split: str = "train",
        *,
        batch_size: int,
        unroll_steps: int,
        rank: int = 0,
        world_size: int = 1,
        reverse: bool = False,
        seed: int = 0,
        shuffle: bool = True,
        repeat: bool = True,
        files: Sequence[str] | None = None,
        manifest: Manifest | None = None,
    ) -> None:
        if batch_size < 1 or unroll_steps < 1:
            raise ValueError(f"batch_size {batch_size} and unroll_steps {unroll_steps} must be ≥ 1")
        manifest = manifest or load_manifest(dataset_url)
        units = partition_split(
            dataset_url, select_shards(manifest, split, files), rank, world_size
        )
        if repeat and not units:
            raise DataError(
                f"rank {rank} of {world_size} has no {split} data to repeat: the split has "
                f"fewer sentences than workers; use fewer workers",
                path=dataset_url,
            )
        self.batch_size, self.unroll_steps, self.reverse = batch_size, unroll_steps, reverse
        self._identity = {
            "split": split,
            "rank": rank,
            "world_size": world_size,
            "reverse": reverse,
            "seed": seed,
            "shuffle": shuffle,
            "batch_size": batch_size,
            "files": list(files) if files else None,
        }
        self._source = _SentenceSource(
            dataset_url,
            units,
            files,
            vocab_size=manifest.vocab.size,
            seed=seed,
            shuffle=shuffle,
            repeat=repeat,
        )
        empty = np.zeros(0, np.int64)
        self._inputs: list[np.ndarray] = [empty] * batch_size  # unconsumed tokens of each row
        self._targets: list[np.ndarray] = [empty] * batch_size
        self._exhausted = False  # the single pass has ended: rows can no longer refill

    def __iter__(self) -> Iterator[Window]:
        while (window := self.next_window()) is not None:
            yield window

    def next_window(self) -> Window | None:
        """The next ``(B, T)`` window of every row, or None once every row is exhausted."""
        self._fill()
        steps = self.unroll_steps
        inputs = np.full((self.batch_size, steps), NO_TOKEN, dtype=np.int64)  # (B, T)
        targets = np.full((self.batch_size, steps), NO_TOKEN, dtype=np.int64)  # (B, T)
        for row in range(self.batch_size):
            taken = min(steps, len(self._inputs[row]))
            inputs[row, :taken] = self._inputs[row][:taken]
            targets[row, :taken] = self._targets[row][:taken]
            self._inputs[row] = self._inputs[row][taken:]
            self._targets[row] = self._targets[row][taken:]
        if (inputs[:, 0] < 0).all():
            return None
        return Window(inputs, targets)

    def _fill(self) -> None:
        """Top every row up to T tokens; rows pull in order of the position where they run out."""
        levels = np.array([len(tokens) for tokens in self._inputs])  # (B,)
        for position in range(self.unroll_steps):
            if self._exhausted:
                return
            for row in np.flatnonzero(levels == position):
                sentence = self._source.next_sentence()
                if sentence is None:
                    self._exhausted = True
                    return
                inputs, targets = self._with_markers(*sentence)
                self._inputs[row] = np.concatenate([self._inputs[row], inputs])
                self._targets[row] = np.concatenate([self._targets[row], targets])
                levels[row] += len(inputs)

    def _with_markers(
        self, types: np.ndarray, targets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(n+1,)`` inputs and targets of one sentence, in this stream's direction."""
        if self.reverse:
            inputs = np.concatenate([[EOS_ID], types[::-1]])
            shifted = np.concatenate([targets[::-1], [BOS_ID]])
        else:
            inputs = np.concatenate([[BOS_ID], types])
            shifted = np.concatenate([targets, [EOS_ID]])
        return inputs.astype(np.int64), shifted.astype(np.int64)

    def state_dict(self) -> dict[str, Any]:
        """Source position and every row's unconsumed tokens (small, picklable)."""
        epoch, unit, sentence = self._source.position()
        return {
            "identity": dict(self._identity),
            "position": [epoch, unit, sentence],
            "exhausted": self._exhausted,
            "inputs": [tokens.copy() for tokens in self._inputs],
            "targets": [tokens.copy() for tokens in self._targets],
        }

    @staticmethod
    def saved_seed(state: Mapping[str, Any]) -> int:
        """The shuffling seed of the stream whose :meth:`state_dict` ``state`` is: what a
        stream that resumes it must be built with."""
        return int(state["identity"]["seed"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; the stream must be built with the same arguments."""
        if state["identity"] != self._identity:
            raise ValueError(f"stream state of {state['identity']} cannot resume {self._identity}")
        self._source.seek(*state["position"])
        self._exhausted = bool(state["exhausted"])
        self._inputs = [np.asarray(tokens, dtype=np.int64) for tokens in state["inputs"]]
        self._targets = [np.asarray(tokens, dtype=np.int64) for tokens in state["targets"]]
