"""The frozen biLM's layer activations for a task's sentences, computed once and kept on disk.

Adapting trains only the mix and the head, so the fixed biLM runs once, not every epoch. An entry
is named by a hash of the weights, the tokens and the dtype; one whose sizes disagree is rebuilt,
but contents are not checked, since that would read the whole array on every open.
Shapes: B rows, T tokens, L layers (LSTM layers + 1), D layer width (2P), N tokens of a split.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from elmo_core.config import ModelConfig
from elmo_core.model.elmo import remove_sentence_boundaries
from elmo_core.text.char_ids import batch_to_ids

CACHE_FORMAT_VERSION = 1
ACTIVATIONS_FILE = "activations.npy"
OFFSETS_FILE = "offsets.npy"
META_FILE = "meta.json"
CacheDtype = Literal["float16", "float32"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedActivations:
    """One cache entry: ``activations (N, L, D)`` memory-mapped, ``offsets (S + 1,)`` in memory."""

    directory: Path
    key: str
    activations: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_layers(self) -> int:
        return int(self.activations.shape[1])

    @property
    def layer_dim(self) -> int:
        return int(self.activations.shape[2])

    def select(self, sentences: Sequence[int] | np.ndarray) -> CachedActivations:
        """The entry of ``sentences`` alone, in that order, copied into memory (a training
        subset: the sample-efficiency curve trains on fractions of a split)."""
        rows = np.asarray(sentences, dtype=np.int64)  # (S',)
        starts, lengths = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (S' + 1,)
        activations = self.activations[flat_positions(starts, lengths)]  # (N', L, D)
        return CachedActivations(self.directory, self.key, activations, offsets)

    def batch(self, indices: Sequence[int] | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Sentences ``indices`` → float32 ``layers (L, B, T, D)`` (zero padding), ``mask``."""
        rows = np.asarray(indices, dtype=np.int64)  # (B,)
        padded, mask = pad_ragged(self.activations, self.offsets, rows)
        layers = torch.from_numpy(padded).float().permute(2, 0, 1, 3).contiguous()  # (L, B, T, D)
        return layers, torch.from_numpy(mask)


def pad_ragged(
    flat: np.ndarray, offsets: np.ndarray, indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``indices`` of a ragged array (row ``i`` is ``flat[offsets[i]:offsets[i + 1]]``).

    → ``padded (B, T, *flat.shape[1:])`` with zeros after each row's end, ``mask (B, T)``; ``T``
    is the longest selected row. One fancy-indexed read of exactly the selected items.
    """
    starts = offsets[indices]  # (B,)
    lengths = offsets[indices + 1] - starts  # (B,)
    num_steps = int(lengths.max()) if len(lengths) else 0
    mask = np.arange(num_steps) < lengths[:, None]  # (B, T)
    padded = np.zeros((len(indices), num_steps, *flat.shape[1:]), dtype=flat.dtype)
    padded[mask] = flat[flat_positions(starts, lengths)]  # row-major order matches the mask's
    return padded, mask


def flat_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + n) for s, n in zip(starts, lengths))`` without a Python loop."""
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)  # (total,)
    return np.arange(total, dtype=np.int64) + shift


def live_activations(
    bilm: nn.Module, sentences: Sequence[Sequence[str]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One stateless, eval-mode, no-grad biLM pass → float32 ``layers (L, B, T, D)``, ``mask``.

    The markers the biLM adds are stripped (as bilm-tf before the mix). This is the cache's
    builder and the live path of inference on new sentences, so both see the same numbers.
    """
    if getattr(bilm, "stateful", False):
        raise ValueError("activations for a task need a stateless biLM (state reset per batch)")
    device = next(bilm.parameters()).device
    was_training = bilm.training
    bilm.eval()
    try:
        with torch.no_grad():
            output = bilm(batch_to_ids([list(tokens) for tokens in sentences]).to(device))
    finally:
        bilm.train(was_training)
    stripped = [remove_sentence_boundaries(layer, output.mask) for layer in output.activations]
    layers = torch.stack([layer for layer, _ in stripped]).float()  # (L, B, T, D)
    return layers, stripped[0][1]


def bilm_fingerprint(bilm: nn.Module) -> str:
    """A hash of the biLM's config, its warm-up sentences (its start state) and every state_dict
    tensor (name, dtype, shape, bytes)."""
    digest = hashlib.blake2b(digest_size=16)
    config = getattr(bilm, "config", None)
    if config is not None:
        digest.update(config.model_dump_json().encode())
    digest.update(json.dumps(getattr(bilm, "warmup", [])).encode())
    for name, tensor in sorted(bilm.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def data_fingerprint(sentences: Sequence[Sequence[str]]) -> str:
    """A hash of the tokens of every sentence, in order (JSON per sentence, so unambiguous)."""
    digest = hashlib.blake2b(digest_size=16)
    for tokens in sentences:
        digest.update(json.dumps(list(tokens), ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


class ActivationCache:
    """A directory of cache entries, one per (biLM, sentences, dtype)."""

    def __init__(self, cache_dir: str | Path, dtype: CacheDtype = "float16") -> None:
        self.cache_dir = Path(cache_dir)
        self.dtype = dtype

    def key(self, bilm: nn.Module, sentences: Sequence[Sequence[str]]) -> str:
        parts = [bilm_fingerprint(bilm), data_fingerprint(sentences), self.dtype]
        parts.append(f"v{CACHE_FORMAT_VERSION}")
        return hashlib.blake2b("|".join(parts).encode(), digest_size=16).hexdigest()

    def get_or_build(
        self,
        bilm: nn.Module,
        sentences: Sequence[Sequence[str]],
        batch_size: int = 64,
        progress: bool = True,
    ) -> CachedActivations:
        """The entry for ``sentences`` under ``bilm``: opened if valid, else built and stored."""
        key = self.key(bilm, sentences)
        directory = self.cache_dir / key
        if directory.exists():
            try:
                return open_entry(directory, key)
            except (OSError, ValueError, KeyError) as err:
                logger.warning("rebuilding activation cache %s: %s", directory, err)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        staging = self.cache_dir / f".tmp-{key}-{uuid.uuid4().hex}"
        try:
            self._write(staging, key, bilm, sentences, batch_size, progress)
            _publish(staging, directory, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return open_entry(directory, key)

    def _write(
        self,
        staging: Path,
        key: str,
        bilm: nn.Module,
        sentences: Sequence[Sequence[str]],
        batch_size: int,
        progress: bool,
    ) -> None:
        """Run the biLM over ``sentences`` batched by length and fill the arrays in ``staging``."""
        staging.mkdir()
        lengths = np.array([len(tokens) for tokens in sentences], dtype=np.int64)  # (S,)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (S+1,)
        config = cast(ModelConfig, bilm.config)
        num_layers = config.lstm.num_layers + 1  # [x; x] and one per LSTM layer
        layer_dim = 2 * config.lstm.projection_dim
        array = np.lib.format.open_memmap(
            staging / ACTIVATIONS_FILE, "w+", self.dtype, (int(offsets[-1]), num_layers, layer_dim)
        )  # (N, L, D)
        order = np.argsort(lengths, kind="stable")  # similar lengths share a batch: little padding
        with tqdm(
            total=len(order), desc="biLM activations", unit="sent", disable=not progress
        ) as bar:
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                if lengths[rows].max(initial=0) > 0:
                    layers, mask = live_activations(bilm, [sentences[i] for i in rows])
                    values = layers.permute(1, 2, 0, 3)[mask]  # (n, L, D) in row-major order
                    array[flat_positions(offsets[rows], lengths[rows])] = values.cpu().numpy()
                bar.update(len(rows))
        array.flush()
        del array
        np.save(staging / OFFSETS_FILE, offsets)
        meta = {"key": key, "version": CACHE_FORMAT_VERSION, "dtype": self.dtype}
        meta |= {"num_tokens": int(offsets[-1]), "num_layers": num_layers, "layer_dim": layer_dim}
        (staging / META_FILE).write_text(json.dumps(meta))


def open_entry(directory: Path, key: str) -> CachedActivations:
    """Open and check an entry; ``ValueError`` (or ``OSError``) when it is incomplete or foreign."""
    meta = json.loads((directory / META_FILE).read_text())
    if meta["key"] != key or meta["version"] != CACHE_FORMAT_VERSION:
        raise ValueError(f"entry is {meta['key']} v{meta['version']}, expected {key}")
    activations = np.load(directory / ACTIVATIONS_FILE, mmap_mode="r")
    offsets = np.load(directory / OFFSETS_FILE)
    expected = (meta["num_tokens"], meta["num_layers"], meta["layer_dim"])
    if activations.shape != expected or activations.dtype != np.dtype(meta["dtype"]):
        raise ValueError(f"activations {activations.shape} {activations.dtype}, meta {meta}")
    size = (directory / ACTIVATIONS_FILE).stat().st_size
    if activations.offset + activations.nbytes != size:
        raise ValueError(f"activations file holds {size} bytes, not {activations.nbytes}+header")
    if offsets[0] != 0 or offsets[-1] != expected[0] or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets do not describe the activations")
    return CachedActivations(directory, key, activations, offsets)


def _publish(staging: Path, directory: Path, key: str) -> None:
    """Rename ``staging`` to ``directory``; a good entry another job published meanwhile wins."""
    if directory.exists():
        try:
            open_entry(directory, key)
            return
        except (OSError, ValueError, KeyError):
            stale = directory.with_name(f".stale-{directory.name}-{uuid.uuid4().hex}")
            with contextlib.suppress(FileNotFoundError):  # another job moved it first
                os.rename(directory, stale)
            shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(staging, directory)
    except OSError:
        if not directory.exists():
            raise  # else another job published the same entry first: keep theirs
