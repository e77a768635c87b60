"""CoNLL readers: CoNLL-2003 named entities, CoNLL-U part-of-speech tags and the words of
CoNLL-U sentences (which the parsing type reads trees from).

Tags are kept as written, IOB1 or IOB2, and only their shape is checked:
:func:`~elmo_core.tasks.metrics.tags_to_spans` reads both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from elmo_core.errors import DataError
from elmo_core.tasks.dataset import TaggingExample, TaskDataset, finish_dataset, iter_lines

TagScheme = Literal["iob1", "iob2", "none"]
ConlluColumn = Literal["upos", "xpos"]

_IOB_TAG = re.compile(r"^(O|[BI]-\S+)$")
_CONLLU_COLUMNS = 10
_CONLLU_TAG_INDEX = {"upos": 3, "xpos": 4}


def read_conll2003(
    path: str | Path, *, tag_scheme: TagScheme = "iob1"
) -> TaskDataset[TaggingExample]:
    """Read a CoNLL-2003 NER file (4 or 2 columns; every token line of a file has the same count).

    One token a line, ``word POS chunk NER`` (the released files) or ``word NER``; the tag is the
    last column, a blank line ends a sentence and ``-DOCSTART-`` lines are skipped.

    ``tag_scheme`` ``iob1``/``iob2`` requires tags of the form ``O``, ``B-TYPE`` or ``I-TYPE``;
    ``none`` accepts any tag. Skipped items are counted under ``skipped["docstart"]``.
    """
    examples: list[TaggingExample] = []
    skipped = {"docstart": 0}
    tokens: list[str] = []
    tags: list[str] = []
    num_columns: int | None = None
    for number, line in iter_lines(path):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            skipped["docstart"] += bool(fields)
            if tokens:
                examples.append(TaggingExample(tokens=tokens, tags=tags))
                tokens, tags = [], []
            continue
        if len(fields) not in (2, 4):
            raise DataError(
                f"{len(fields)} columns; expected 4 ('word POS chunk NER') or 2 ('word NER')",
                path=path,
                line=number,
            )
        if num_columns is None:
            num_columns = len(fields)
        elif len(fields) != num_columns:
            raise DataError(
                f"{len(fields)} columns where earlier lines have {num_columns}",
                path=path,
                line=number,
            )
        tag = fields[-1]
        if tag_scheme != "none" and not _IOB_TAG.match(tag):
            raise DataError(
                f"tag '{tag}' is not O, B-TYPE or I-TYPE (tag_scheme {tag_scheme})",
                path=path,
                line=number,
            )
        tokens.append(fields[0])
        tags.append(tag)
    if tokens:
        examples.append(TaggingExample(tokens=tokens, tags=tags))
    return finish_dataset(path, examples, skipped)


def read_conllu(path: str | Path, *, column: ConlluColumn = "upos") -> TaskDataset[TaggingExample]:
    """Read a CoNLL-U file as (FORM, UPOS) or (FORM, XPOS) sentences.

    Multiword tokens (``1-2``) and empty nodes (``8.1``) are skipped, so that tokens are the
    syntactic words, and counted under ``skipped["multiword_token"]`` and ``skipped["empty_node"]``
    (comments are not counted). An unspecified tag (``_``) in the chosen column is an error:
    some treebanks have no XPOS, and training on ``_`` would silently learn nothing.
    """
    skipped = {"multiword_token": 0, "empty_node": 0}
    examples = []
    for words in conllu_sentences(path, skipped):
        for number, fields in words:
            require_field(
                fields[_CONLLU_TAG_INDEX[column]], column.upper(), fields[0], path, number
            )
        examples.append(
            TaggingExample(
                tokens=[fields[1] for _, fields in words],
                tags=[fields[_CONLLU_TAG_INDEX[column]] for _, fields in words],
            )
        )
    return finish_dataset(path, examples, skipped)


def conllu_sentences(
    path: str | Path, skipped: dict[str, int]
) -> Iterator[list[tuple[int, list[str]]]]:
    """Each sentence's words as (line number, its 10 fields), multiword tokens and empty nodes
    skipped and counted; a word without a FORM is an error."""
    words: list[tuple[int, list[str]]] = []
    for number, line in iter_lines(path):
        if not line.strip():
            if words:
                yield words
                words = []
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != _CONLLU_COLUMNS:
            raise DataError(
                f"{len(fields)} tab-separated columns; CoNLL-U requires {_CONLLU_COLUMNS}",
                path=path,
                line=number,
            )
        word_id = fields[0]
        if "-" in word_id:
            skipped["multiword_token"] += 1
            continue
        if "." in word_id:
            skipped["empty_node"] += 1
            continue
        if not word_id.isdigit():
            raise DataError(f"word id '{word_id}' is not an integer", path=path, line=number)
        require_field(fields[1], "FORM", word_id, path, number)
        words.append((number, fields))
    if words:
        yield words


def require_field(value: str, column: str, word_id: str, path: str | Path, line: int) -> None:
    if value in ("", "_"):
        raise DataError(f"word {word_id} has no {column}", path=path, line=line)
