"""What every task reader returns: typed examples plus counts of what it skipped.

Readers are strict: a malformed line is a :class:`~elmo_core.errors.DataError` naming the file and
line, while items the format marks as unusable are skipped and counted in
:attr:`TaskDataset.skipped`, so a run can log how much of a file it used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from elmo_core.errors import DataError


class Example(Protocol):
    """What training asks of every type's example: its sentences (one per side: two for a
    pair), the labels it holds and its target ids. A type's reader returns its own kind."""

    per_token: ClassVar[bool]  # a target for every token, not one for the example

    def sides(self) -> list[list[str]]: ...

    def labels(self) -> list[str]: ...

    def target_ids(self, label_ids: Mapping[str, int]) -> list[int]: ...


@dataclass(frozen=True)
class TaggingExample:
    """One sentence for sequence labelling: one tag per token."""

    tokens: list[str]
    tags: list[str]
    per_token: ClassVar[bool] = True

    def sides(self) -> list[list[str]]:
        return [self.tokens]

    def labels(self) -> list[str]:
        return self.tags

    def target_ids(self, label_ids: Mapping[str, int]) -> list[int]:
        return [label_ids[tag] for tag in self.tags]


class _OneLabel:
    """An example with one label, its target."""

    label: str
    per_token: ClassVar[bool] = False

    def labels(self) -> list[str]:
        return [self.label]

    def target_ids(self, label_ids: Mapping[str, int]) -> list[int]:
        return [label_ids[self.label]]


@dataclass(frozen=True)
class ClassificationExample(_OneLabel):
    """One sentence (or SST phrase) and its label."""

    tokens: list[str]
    label: str

    def sides(self) -> list[list[str]]:
        return [self.tokens]


@dataclass(frozen=True)
class PairExample(_OneLabel):
    """A sentence pair (SNLI premise and hypothesis) and its label."""

    premise: list[str]
    hypothesis: list[str]
    label: str

    def sides(self) -> list[list[str]]:
        return [self.premise, self.hypothesis]


ExampleT = TypeVar("ExampleT", bound=Example)


@dataclass
class TaskDataset(Generic[ExampleT]):
    """The examples read from one file, and how many items of each kind were skipped."""

    path: Path
    examples: list[ExampleT]
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[ExampleT]:
        return iter(self.examples)

    def __getitem__(self, index: int) -> ExampleT:
        return self.examples[index]

    def labels(self) -> list[str]:
        """The sorted set of labels (tags, relations) that occur in this dataset."""
        return sorted({label for example in self.examples for label in example.labels()})


def iter_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number from 1, text without the newline)`` of a UTF-8 file.

    Decoding line by line (not the whole file at once) lets a bad byte be reported with its line.
    A UTF-8 byte-order mark at the start of the file is dropped.
    """
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", path=path)
    if not path.is_file():
        raise DataError("not a regular file", path=path)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"invalid UTF-8 at byte {err.start}", path=path, line=number
                ) from None
            if number == 1:
                text = text.removeprefix("\ufeff")
            yield number, text.rstrip("\r\n")


def finish_dataset(
    path: str | Path, examples: list[ExampleT], skipped: dict[str, int]
) -> TaskDataset[ExampleT]:
    """Wrap the examples, refusing a file that yielded none (empty, or everything skipped)."""
    if not examples:
        detail = f" (skipped: {_describe(skipped)})" if any(skipped.values()) else ""
        raise DataError(f"no examples in file{detail}", path=path)
    return TaskDataset(path=Path(path), examples=examples, skipped=dict(skipped))


def _describe(skipped: dict[str, int]) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in sorted(skipped.items()) if count)
