"""Stanford Sentiment Treebank reader (Socher et al. 2013): PTB trees, one per line.

A sentence takes its root's label; with ``phrases`` every subtree is an example of its own, the
paper's phrase-level training set (AllenNLP's ``use_subtrees``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from elmo_core.errors import DataError
from elmo_core.tasks.dataset import ClassificationExample, TaskDataset, finish_dataset, iter_lines

_TREE_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass
class Tree:
    """A parsed node: its label and its children (subtrees or words), in order."""

    label: str
    children: list[Tree | str]

    def leaves(self) -> list[str]:
        """The words under this node, left to right."""
        words: list[str] = []
        for child in self.children:
            if isinstance(child, Tree):
                words.extend(child.leaves())
            else:
                words.append(child)
        return words

    def subtrees(self) -> Iterator[Tree]:
        """This node and every node below it, in pre-order."""
        yield self
        for child in self.children:
            if isinstance(child, Tree):
                yield from child.subtrees()


def read_sst(path: str | Path, *, phrases: bool = False) -> TaskDataset[ClassificationExample]:
    """Read SST trees as sentence examples, or as every phrase when ``phrases`` is true.

    Phrases come root first, then in pre-order, single words and repeats included; tokens are
    kept as written (``-LRB-``/``-RRB-``).
    """
    examples: list[ClassificationExample] = []
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        tree = parse_tree(line, path=path, line=number)
        nodes = tree.subtrees() if phrases else iter((tree,))
        examples.extend(
            ClassificationExample(tokens=node.leaves(), label=node.label) for node in nodes
        )
    return finish_dataset(path, examples, {})


def parse_tree(text: str, *, path: str | Path | None = None, line: int | None = None) -> Tree:
    """Parse one PTB-style tree with integer labels; errors name the file, line and column."""

    def fail(message: str, column: int) -> DataError:
        return DataError(f"{message} (column {column})", path=path, line=line)

    stack: list[Tree] = []
    root: Tree | None = None
    expect_label = False
    for match in _TREE_TOKEN.finditer(text):
        token, column = match.group(), match.start() + 1
        if root is not None:
            raise fail("text after the end of the tree", column)
        if expect_label:
            if token in ("(", ")"):
                raise fail("missing label after '('", column)
            if not token.isdigit():
                raise fail(f"label '{token}' is not an integer", column)
            stack.append(Tree(label=token, children=[]))
            expect_label = False
        elif token == "(":
            expect_label = True
        elif token == ")":
            if not stack:
                raise fail("unbalanced parentheses: ')' without a matching '('", column)
            node = stack.pop()
            if not node.children:
                raise fail(f"node '({node.label}' has no children", column)
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
        elif not stack:
            raise fail(f"word '{token}' outside any '(label ...)' node", column)
        else:
            stack[-1].children.append(token)
    if stack or expect_label:
        unclosed = len(stack) + expect_label
        raise DataError(f"unbalanced parentheses: {unclosed} '(' not closed", path=path, line=line)
    if root is None:
        raise DataError("no tree on this line", path=path, line=line)
    return root
