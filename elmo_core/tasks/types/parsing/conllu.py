"""CoNLL-U dependency trees, as the parsing type reads them: each word's head and relation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from elmo_core.errors import DataError
from elmo_core.tasks.conll import conllu_sentences, require_field
from elmo_core.tasks.dataset import TaskDataset, finish_dataset

RelationLabels = Literal["universal", "full"]


@dataclass(frozen=True)
class ParseExample:
    """One sentence's dependency tree: each word's head (0: the root, else a word from 1) and the
    relation to it. A word's target id is ``head · R + relation id`` (R relations)."""

    tokens: list[str]
    heads: list[int]
    relations: list[str]
    per_token: ClassVar[bool] = True

    def sides(self) -> list[list[str]]:
        return [self.tokens]

    def labels(self) -> list[str]:
        return self.relations

    def target_ids(self, label_ids: Mapping[str, int]) -> list[int]:
        size = len(label_ids)
        return [h * size + label_ids[r] for h, r in zip(self.heads, self.relations, strict=True)]


def read_conllu_trees(
    path: str | Path, *, relations: RelationLabels = "universal"
) -> TaskDataset[ParseExample]:
    """Read a CoNLL-U file's basic dependency trees: each word's HEAD (column 7, 0 for the root)
    and DEPREL (column 8), its subtype dropped (``nmod:poss`` → ``nmod``) with ``universal``, as
    CoNLL 2018's LAS compares them.

    Words are read as :func:`~elmo_core.tasks.conll.read_conllu` reads them. A head that is no
    integer or names no word of its sentence, a missing relation, a sentence without exactly one
    word on the root or with a cycle is a :class:`DataError` naming the file and line.
    """
    skipped = {"multiword_token": 0, "empty_node": 0}
    examples = []
    for words in conllu_sentences(path, skipped):
        heads, labels = [], []
        for number, fields in words:
            head, relation = fields[6], fields[7]
            if not head.isdigit():
                raise DataError(
                    f"word {fields[0]}: head '{head}' is not an integer", path=path, line=number
                )
            if int(head) > len(words):
                raise DataError(
                    f"word {fields[0]}: head {head} is outside its sentence of {len(words)} words",
                    path=path,
                    line=number,
                )
            require_field(relation, "DEPREL", fields[0], path, number)
            heads.append(int(head))
            labels.append(relation.split(":")[0] if relations == "universal" else relation)
        _check_tree(heads, path, words[0][0])
        examples.append(ParseExample([fields[1] for _, fields in words], heads, labels))
    return finish_dataset(path, examples, skipped)


def _check_tree(heads: list[int], path: str | Path, line: int) -> None:
    """One word on the root and every word reaching it: a tree (``line``: its first word's)."""
    roots = [i + 1 for i, head in enumerate(heads) if head == 0]
    if len(roots) != 1:
        raise DataError(
            f"the sentence has {len(roots)} words on the root (words {roots}); a tree has one",
            path=path,
            line=line,
        )
    for word in range(1, len(heads) + 1):
        seen = set()
        while word != 0:
            if word in seen:
                raise DataError(
                    f"the sentence's heads form a cycle through word {word}", path=path, line=line
                )
            seen.add(word)
            word = heads[word - 1]
