"""Single-sentence classification readers: ``label sentence`` lines, and two-column TSV."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from elmo_core.errors import DataError
from elmo_core.tasks.dataset import ClassificationExample, TaskDataset, finish_dataset, iter_lines

LabelColumn = Literal["first", "last"]


def read_label_text(path: str | Path) -> TaskDataset[ClassificationExample]:
    """Read ``label sentence`` lines, the label being the first whitespace-separated field (TREC).

    Sentences are split on whitespace (the files come pre-tokenized); blank lines are ignored.
    """
    examples: list[ClassificationExample] = []
    for number, line in iter_lines(path):
        fields = line.split()
        if not fields:
            continue
        if len(fields) == 1:
            raise DataError(
                f"only a label ('{fields[0]}'); expected 'label sentence'", path=path, line=number
            )
        examples.append(ClassificationExample(tokens=fields[1:], label=fields[0]))
    return finish_dataset(path, examples, {})


def read_tsv(
    path: str | Path, *, label_column: LabelColumn = "first", header: bool = False
) -> TaskDataset[ClassificationExample]:
    """Read two-column TSV lines; ``header`` skips the first line (``skipped["header"]``).

    ``label\tsentence``, or ``sentence\tlabel`` (GLUE's SST-2) with ``label_column="last"``;
    sentences are split on whitespace and blank lines are ignored.
    """
    examples: list[ClassificationExample] = []
    skipped = {"header": 0}
    for number, line in iter_lines(path):
        if header and number == 1:
            skipped["header"] = 1
            continue
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            layout = "label\\tsentence" if label_column == "first" else "sentence\\tlabel"
            raise DataError(
                f"{len(fields)} tab-separated fields; expected 2 ('{layout}')",
                path=path,
                line=number,
            )
        label, sentence = fields if label_column == "first" else fields[::-1]
        label, tokens = label.strip(), sentence.split()
        if not label or not tokens:
            raise DataError(f"empty {'label' if not label else 'sentence'}", path=path, line=number)
        examples.append(ClassificationExample(tokens=tokens, label=label))
    return finish_dataset(path, examples, skipped)
