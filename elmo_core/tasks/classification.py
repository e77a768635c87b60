"""Single-sentence classification readers for plain-text formats.

``label_text``: ``label<space>sentence`` per line, the label being the first whitespace-separated
field, as in TREC (Li & Roth 2002):
``DESC:manner How did serfdom develop in and then leave Russia ?``.

``tsv``: exactly two tab-separated fields per line, ``label\\tsentence`` or ``sentence\\tlabel``
(``label_column``), optionally after one header line (GLUE's SST-2 ``sentence\\tlabel``).

In both, sentences are split on whitespace (the files are distributed pre-tokenized) and blank
lines are ignored; a line without a sentence is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from elmo_core.errors import DataError
from elmo_core.tasks.dataset import ClassificationExample, TaskDataset, finish_dataset, iter_lines

LabelColumn = Literal["first", "last"]


def read_label_text(path: str | Path) -> TaskDataset[ClassificationExample]:
    """Read ``label sentence`` lines."""
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
    """Read two-column TSV lines; ``header`` skips the first line (``skipped["header"]``)."""
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
