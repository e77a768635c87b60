"""Build the bundled ``docstrings`` task: what a docstring's first sentence documents.

    python examples/tasks/make_docstrings.py    # rewrites examples/tasks/data/docstrings.*.txt

A three-way sentence classification in the bundled corpus's own domain (English prose about
Python code): is the sentence the start of a **module**'s, a **class**'s or a **function**'s
docstring (methods count as functions)? The labels come from the syntax tree, not from a person.
The sentences come from libraries outside the standard library (numpy, pandas, mlflow: BSD-3,
BSD-3, Apache-2.0), so none is in the ``python-docs`` pretraining corpus; any sentence that is
there anyway is dropped. Sentences are cleaned as the corpus is
(:func:`pipelines.prepare.sample_corpus.clean_text`) and tokenized by the corpus's tokenizer.

Each split holds as many sentences of each kind, drawn with a fixed seed from files walked in
sorted order: few training labels, on purpose (the sample-efficiency setting the demo shows).
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from elmo_core.text.tokenize import MosesTokenizer
from pipelines.prepare.sample_corpus import clean_text, documentable, stdlib_docstrings

PACKAGES = ("numpy", "pandas", "mlflow")
PER_KIND = {"train": 60, "dev": 50, "test": 100}
KINDS = {ast.Module: "module", ast.ClassDef: "class"}  # anything else: "function"
SEED = 0
OUT = Path(__file__).resolve().parent / "data"


def first_sentences(package_dir: Path) -> Iterator[tuple[str, str]]:
    """``(kind, first sentence)`` of every docstring under ``package_dir``, tests left out."""
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("test", "_", ".")))
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test"):
                continue
            try:
                tree = ast.parse(Path(dirpath, name).read_bytes())
            except (SyntaxError, ValueError):
                continue
            for node in documentable(tree):
                docstring = ast.get_docstring(node, clean=True)
                sentence = next(clean_text(docstring), None) if docstring else None
                if sentence is not None:
                    yield KINDS.get(type(node), "function"), sentence


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    in_corpus = set(stdlib_docstrings(Path(sysconfig.get_paths()["stdlib"])))
    by_kind: dict[str, list[str]] = {}
    seen: set[str] = set()
    for package in PACKAGES:
        for kind, sentence in first_sentences(site / package):
            if sentence not in seen and sentence not in in_corpus:
                seen.add(sentence)
                by_kind.setdefault(kind, []).append(sentence)
    rng = random.Random(SEED)
    tokenizer = MosesTokenizer("en")
    drawn = {
        kind: rng.sample(sentences, sum(PER_KIND.values())) for kind, sentences in by_kind.items()
    }
    start = 0
    for split, count in PER_KIND.items():
        lines = [
            f"{kind} {' '.join(token for part in tokenizer.tokenize(s) for token in part)}"
            for kind in sorted(drawn)
            for s in drawn[kind][start : start + count]
        ]
        rng.shuffle(lines)
        (OUT / f"docstrings.{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        start += count


if __name__ == "__main__":
    main()
