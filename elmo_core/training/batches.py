"""Training batches built ahead of the step, in background processes when asked.

On a GPU a step is over before one core can cut the next windows, so ``DataLoader`` workers build
each window with its token types, sampled candidates and softmax rows: the device neither draws
nor sorts. A window carries its stream's position, so a resumed run reads what a straight run does.
Shapes: B rows, T window, W chars per token.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from elmo_core.data.batching import TokenStream
from elmo_core.data.manifest import Manifest
from elmo_core.errors import ElmoError
from elmo_core.model.char_cnn import TokenTypes, token_types
from elmo_core.model.sampler import (
    LogUniformSampler,
    SampledCandidates,
    touched_rows,
    union_of_sorted,
)

PREFETCH_PER_WORKER = 4  # windows each loader process keeps ready
CANDIDATE_RNG = "candidate_rng"  # the stream state's key for its candidate generator

# Loader processes fork from a server process that has imported this module (torch included), not
# from a trainer that holds threads, CUDA and Ray's connections: a fork of that can fail on its way
# out, and starting afresh each time (spawn) would import torch again for every loader.
_LOADER_PROCESSES = multiprocessing.get_context("forkserver")
_LOADER_PROCESSES.set_forkserver_preload([__name__])


@dataclass(frozen=True)
class CandidateSpec:
    """The sampled-softmax draw a stream makes with each window (``model.num_samples``)."""

    vocab_size: int
    num_samples: int


@dataclass(frozen=True)
class StreamSpec:
    """One direction's training stream, as any process rebuilds it (picklable)."""

    dataset_url: str
    batch_size: int
    unroll_steps: int
    rank: int
    world_size: int
    reverse: bool
    seed: int
    candidates: CandidateSpec | None = None  # none: the softmax draws them in the step
    state: dict[str, Any] | None = None  # a TokenStream.state_dict() to continue from

    def open(self, manifest: Manifest) -> TokenStream:
        stream = TokenStream(
            self.dataset_url,
            "train",
            batch_size=self.batch_size,
            unroll_steps=self.unroll_steps,
            rank=self.rank,
            world_size=self.world_size,
            reverse=self.reverse,
            seed=self.seed,
            manifest=manifest,
        )
        if self.state is not None:
            stream.load_state_dict(self.state)
        return stream

    def starting_at(self, state: dict[str, Any]) -> StreamSpec:
        """This stream from a saved ``state_dict()`` (a checkpoint's, or a position's)."""
        return replace(self, state=state)


@dataclass(frozen=True)
class StreamPosition:
    """A ``TokenStream.state_dict()`` as a few arrays: cheap to send from a loader process (its
    B per-row arrays, pickled one by one, would cost more than building the window)."""

    header: dict[str, Any]  # identity, source position, exhausted
    lengths: np.ndarray  # (B,) unconsumed tokens of each row
    inputs: np.ndarray  # (sum of lengths,)
    targets: np.ndarray  # (sum of lengths,)

    @classmethod
    def of(cls, stream: TokenStream, generator: torch.Generator | None) -> StreamPosition:
        state = stream.state_dict()
        if generator is not None:
            state[CANDIDATE_RNG] = generator.get_state().numpy()
        inputs, targets = state.pop("inputs"), state.pop("targets")
        lengths = np.array([len(row) for row in inputs], dtype=np.int64)
        return cls(state, lengths, np.concatenate(inputs), np.concatenate(targets))

    def state_dict(self) -> dict[str, Any]:
        bounds = np.cumsum(self.lengths)[:-1]
        return {
            **self.header,
            "inputs": np.split(self.inputs, bounds),
            "targets": np.split(self.targets, bounds),
        }


class DirectionWindow(NamedTuple):
    """One direction's window of a step, as the trainer receives it (its char ids are in the
    step's :class:`TokenTypes`)."""

    targets: torch.Tensor  # (B, T) vocabulary ids, -1 where nothing is scored
    candidates: SampledCandidates | None  # drawn for this window, if the stream draws them
    position: StreamPosition  # the stream's position after this window


class StepBatch(NamedTuple):
    """What one training step reads: a window of each stream, their distinct token types and, when
    the streams draw candidates, the softmax rows both windows touch."""

    forward: DirectionWindow
    backward: DirectionWindow
    types: TokenTypes
    softmax_rows: torch.Tensor | None  # (R,) sorted, distinct: targets and candidates

    def step_arguments(self, device: torch.device) -> dict[str, Any]:
        """``TrainingStep``'s arguments on ``device``: copies from pinned memory do not block, and
        each window's ``(B, T, W)`` char ids are gathered there from the types."""
        char_ids, inverse, used_width = (
            self.types.char_ids.to(device, non_blocking=True),
            self.types.inverse.to(device, non_blocking=True),
            self.types.used_width,
        )
        forward_inputs, backward_inputs = char_ids[inverse]  # 2 × (B, T, W)
        return {
            "forward_inputs": forward_inputs,
            "forward_targets": self.forward.targets.to(device, non_blocking=True),
            "backward_inputs": backward_inputs,
            "backward_targets": self.backward.targets.to(device, non_blocking=True),
            "candidates": self.candidates(),
            "types": TokenTypes(char_ids, inverse, used_width),
            "softmax_rows": None
            if self.softmax_rows is None
            else self.softmax_rows.to(device, non_blocking=True),
        }

    def candidates(self) -> tuple[SampledCandidates, SampledCandidates] | None:
        """(forward, backward) candidate sets drawn ahead, or None: the softmax draws them."""
        forward, backward = self.forward.candidates, self.backward.candidates
        return None if forward is None or backward is None else (forward, backward)


class _Arrays(NamedTuple):
    """A window as a loader process sends it: NumPy arrays travel through its pipe at memcpy speed,
    where tensors would each be moved to a new shared-memory segment."""

    types: tuple[np.ndarray, np.ndarray, int]  # the window's TokenTypes: (U, W), (B, T), width
    targets: np.ndarray
    candidates: tuple[np.ndarray, int] | None  # ids (K,), num_tries
    softmax_rows: np.ndarray | None  # (R,) what targets and candidates touch, if drawn
    position: StreamPosition


class _Failed(NamedTuple):
    """A user's error in a loader process, sent whole (the loader would re-raise only its text)."""

    error: ElmoError


class _Reader:
    """One direction in a loader process: its stream and, if it draws them, its candidates."""

    def __init__(self, spec: StreamSpec, manifest: Manifest, char_table: np.ndarray) -> None:
        self.stream, self.char_table = spec.open(manifest), char_table
        self.sampler: LogUniformSampler | None = None
        self.generator: torch.Generator | None = None
        self.num_samples = 0
        if spec.candidates is not None:
            self.sampler = LogUniformSampler(spec.candidates.vocab_size)
            self.num_samples = spec.candidates.num_samples
            self.generator = torch.Generator()
            saved = (spec.state or {}).get(CANDIDATE_RNG)
            if saved is None:  # each rank and direction draws its own
                seed = np.random.SeedSequence([spec.seed, spec.rank]).generate_state(1)[0]
                self.generator.manual_seed(int(seed))
            else:
                self.generator.set_state(torch.as_tensor(np.asarray(saved), dtype=torch.uint8))

    def next(self) -> _Arrays:
        window = self.stream.next_window()
        assert window is not None  # training streams repeat forever
        candidates, rows = None, None
        if self.sampler is not None:
            ids, num_tries = self.sampler.sample_unique(self.num_samples, self.generator)
            candidates = (ids.numpy(), int(num_tries))  # a count the sampler found on the host
            rows = touched_rows(window.targets, candidates[0])
        types = token_types(window.inputs, self.char_table)
        return _Arrays(
            (types.char_ids.numpy(), types.inverse.numpy(), types.used_width),
            window.targets,
            candidates,
            rows,
            StreamPosition.of(self.stream, self.generator),
        )


class _Windows(IterableDataset[_Arrays | _Failed]):
    """Forward and backward windows in turn; a loader worker of two builds one direction."""

    def __init__(
        self, specs: tuple[StreamSpec, StreamSpec], manifest: Manifest, char_table: np.ndarray
    ) -> None:
        self.specs, self.manifest, self.char_table = specs, manifest, char_table

    def __iter__(self) -> Iterator[_Arrays | _Failed]:
        worker = get_worker_info()
        mine = self.specs if worker is None or worker.num_workers == 1 else (self.specs[worker.id],)
        try:
            readers = [_Reader(spec, self.manifest, self.char_table) for spec in mine]
            while True:
                for reader in readers:
                    yield reader.next()
        except ElmoError as error:
            if worker is None:
                raise
            yield _Failed(error)


def _unchanged(window: Any) -> Any:
    """The loader's per-sample conversion: none (its default would turn the states into tensors)."""
    return window


# Sizes per octave of each shape (bucket()): a step's type and row counts vary by a few percent
# around their mean, and its used width by a few chars. Eight per octave pad the counts by less
# than an eighth, four the width by less than a quarter; on PTB a run then meets 4 shapes (a graph
# each) and the char CNN does 1.06-1.07x the exact shapes' work, where 4, 1 and 4 met 1 or 2 and
# did 1.15-1.20x (benchmarks/results/bench_shape_buckets-2026-11-28.md).
TYPES_PER_OCTAVE, WIDTH_PER_OCTAVE, ROWS_PER_OCTAVE = 8, 4, 8


def bucket(size: int, cap: int, per_octave: int) -> int:
    """``size`` rounded up to the next of ``per_octave`` (a power of two) evenly spaced sizes
    between two powers of two (four: …, 2048, 2560, 3072, 3584, 4096, …), at most ``cap``
    (≥ ``size``)."""
    octave = max(0, (size - 1).bit_length() - 1)  # 2**octave < size <= 2**(octave + 1)
    spacing = 1 << max(0, octave - (per_octave.bit_length() - 1))
    return min(cap, -(-size // spacing) * spacing)


def pad_types(char_ids: np.ndarray, used_width: int, positions: int) -> tuple[np.ndarray, int]:
    """A step's distinct types ``char_ids (U, W)`` padded with all-zero rows to a bucket (at most
    one a position), and its used width to one (at most W)."""
    num_types, width = char_ids.shape
    padding = bucket(num_types, positions, TYPES_PER_OCTAVE) - num_types
    padded = np.concatenate([char_ids, np.zeros((padding, width), char_ids.dtype)])
    return padded, bucket(used_width, width, WIDTH_PER_OCTAVE)


def pad_rows(rows: np.ndarray, size: int) -> np.ndarray:
    """Sorted, distinct softmax ``rows (R,)`` padded to ``(size,)`` (≤ V) with the smallest ids
    not among them: still sorted and distinct, and nothing selects them, so their gradient is
    exactly zero and Adagrad leaves them (and their accumulators) as they were."""
    free = np.ones(size, dtype=bool)
    free[rows[rows < size]] = False
    return union_of_sorted(rows, np.flatnonzero(free)[: size - len(rows)])


class StepBatches:
    """Both streams' windows, step by step; ``workers`` processes (0, 1 or 2) build them ahead.

    ``shape_buckets``: the step's types, softmax rows and char width padded to :func:`bucket`
    sizes. Padded types are all-zero rows no position points at (encoded, never read: their
    gradient is zero); padded rows are :func:`pad_rows`'s; a wider cut of the char ids keeps
    more of each token's constant tail, which leaves every pooled max as it was. Each candidate
    set's draw count then travels as a 0-dim tensor, not a number a CUDA graph would keep.
    """

    def __init__(
        self,
        specs: tuple[StreamSpec, StreamSpec],
        manifest: Manifest,
        char_table: np.ndarray,
        *,
        workers: int,
        pin_memory: bool,
        shape_buckets: bool = False,
    ) -> None:
        if workers not in (0, 1, 2):
            raise ValueError(f"0, 1 or 2 loader workers (one per direction at most), got {workers}")
        loader = DataLoader(
            _Windows(specs, manifest, char_table),
            batch_size=None,
            collate_fn=_unchanged,
            num_workers=workers,
            prefetch_factor=PREFETCH_PER_WORKER if workers else None,
            multiprocessing_context=_LOADER_PROCESSES if workers else None,
            # The loader draws a seed for its workers when iterated: from a generator of its own,
            # not the global one that dropout draws from (a resume restores that one).
            generator=torch.Generator(),
        )
        self._windows: Iterator[_Arrays | _Failed] = iter(loader)
        self._pin_memory = pin_memory
        self._shape_buckets = shape_buckets
        draw = specs[0].candidates
        self._vocab_size = 0 if draw is None else draw.vocab_size

    def __iter__(self) -> Iterator[StepBatch]:
        return self

    def __next__(self) -> StepBatch:
        forward, backward = self._next_arrays(), self._next_arrays()
        (forward_rows, forward_inverse, forward_used) = forward.types
        (backward_rows, backward_inverse, backward_used) = backward.types
        char_ids = np.concatenate([forward_rows, backward_rows])  # (U_f + U_b, W)
        inverse = np.stack([forward_inverse, backward_inverse + len(forward_rows)])  # (2, B, T)
        used_width = max(forward_used, backward_used)
        rows = None
        if forward.softmax_rows is not None and backward.softmax_rows is not None:
            rows = union_of_sorted(forward.softmax_rows, backward.softmax_rows)  # (R,)
        if self._shape_buckets:
            char_ids, used_width = pad_types(char_ids, used_width, inverse.size)
            if rows is not None:
                rows = pad_rows(rows, bucket(len(rows), self._vocab_size, ROWS_PER_OCTAVE))
        # both windows' types, the backward rows after the forward ones
        types = TokenTypes(self._tensor(char_ids), self._tensor(inverse), used_width)
        softmax_rows = None if rows is None else self._tensor(rows)
        return StepBatch(self._window(forward), self._window(backward), types, softmax_rows)

    def _next_arrays(self) -> _Arrays:
        arrays = next(self._windows)
        if isinstance(arrays, _Failed):
            raise arrays.error
        return arrays

    def _window(self, arrays: _Arrays) -> DirectionWindow:
        candidates = None
        if arrays.candidates is not None:
            ids, num_tries = arrays.candidates
            tries = self._pinned(torch.tensor(num_tries)) if self._shape_buckets else num_tries
            candidates = SampledCandidates(self._tensor(ids), tries)
        return DirectionWindow(self._tensor(arrays.targets), candidates, arrays.position)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return self._pinned(torch.from_numpy(array))

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self._pin_memory else tensor

    def close(self) -> None:
        """Stop the loader's processes now: its iterator shuts them down when it is dropped."""
        self._windows = iter(())

    def __enter__(self) -> StepBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
