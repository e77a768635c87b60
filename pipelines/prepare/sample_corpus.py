"""The bundled sample corpus ``python-docs``: English prose that ships with Python itself.

The embedded default needs a real corpus without a download: the standard library's docstrings,
help topics and licence, read with :mod:`ast` (nothing is imported). The same interpreter gives
byte-identical files, so a re-run reuses them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import sys
import sysconfig
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from elmo_core.errors import DataError

SAMPLE_VERSION = 2  # bump when the cleaning changes, so cached copies are rebuilt
MARKER = ".complete"
BYTES_PER_FILE = 512 * 1024
SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "dist-packages",
        "encodings",  # generated codec tables
        "ensurepip",
        "idlelib",
        "lib2to3",
        "pydoc_data",  # read separately, as the reference topics
        "site-packages",
        "turtledemo",
    }
)

_ROLE = re.compile(r":(?:[\w-]+:)+`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")  # :func:`~os.path.join`
_TEX_QUOTE = re.compile(r"``([^`']+?)''")  # ``quoted'' in old docstrings
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"`([^`]+?)`_{0,2}")
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}(?=\S)([^*]+?)(?<=\S)\*{1,2}(?![\w*])")
_FIELD = re.compile(r"^:[\w ]+:\s*")  # :param name: description
_DIRECTIVE = re.compile(r"^\.\. ")
_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_WORD = re.compile(r"[A-Za-z]{2,}")


def write_sample_corpus(dest: Path) -> list[Path]:
    """Write the sample corpus into ``dest`` (or reuse it when already built by this interpreter).

    Returns the sorted text files. Takes a few seconds on first use.
    """
    dest = Path(dest)
    fingerprint = _fingerprint()
    cached = _read_marker(dest)
    if cached is not None and cached[0] == fingerprint:
        return [dest / name for name in cached[1]]
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        names = _write_files(tmp)
        marker = {"fingerprint": fingerprint, "files": names}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        _replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [dest / name for name in names]


def _write_files(out_dir: Path) -> list[str]:
    """Write the text files into ``out_dir``; their sorted names."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    names = _write_chunked(out_dir, "stdlib-docstrings", _unique(stdlib_docstrings(stdlib), seen))
    topics = stdlib / "pydoc_data" / "topics.py"
    if topics.is_file():
        names += _write_chunked(out_dir, "reference-topics", _unique(_topic_texts(topics), seen))
    license_file = stdlib / "LICENSE.txt"
    if license_file.is_file():
        lines = _unique(
            clean_text(license_file.read_text(encoding="utf-8", errors="replace")), seen
        )
        names += _write_chunked(out_dir, "license", lines)
    if not names:
        raise DataError("no docstrings found in the Python standard library", path=stdlib)
    return sorted(names)


def stdlib_docstrings(stdlib: Path) -> Iterator[str]:
    """Cleaned sentences from the module, class and function docstrings below ``stdlib``."""
    for path in _stdlib_sources(stdlib):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue  # a file for another Python version (e.g. lib2to3 test data)
        for node in documentable(tree):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                yield from clean_text(docstring)


_Documentable = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def documentable(node: ast.AST) -> Iterator[_Documentable]:
    """Modules, classes and functions in source order, descending through statement bodies only.

    Much cheaper than :func:`ast.walk`, which also visits every expression node.
    """
    if isinstance(node, _Documentable):
        yield node
    for field in ("body", "orelse", "finalbody", "handlers"):
        children = getattr(node, field, None)
        if isinstance(children, list):
            for child in children:
                if isinstance(child, ast.stmt | ast.excepthandler):
                    yield from documentable(child)


def _stdlib_sources(stdlib: Path) -> Iterator[Path]:
    """The ``.py`` files of the standard library in sorted order, without tests and tools."""
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
        for name in sorted(filenames):
            if name.endswith(".py") and not name.startswith("test"):
                yield Path(dirpath, name)


def _skipped(directory: str) -> bool:
    return directory in SKIP_DIRS or directory.startswith(("test", "config-", "."))


def _topic_texts(topics: Path) -> Iterator[str]:
    """The help topics (language reference prose) stored as a dict literal in ``topics.py``."""
    tree = ast.parse(topics.read_bytes(), filename=str(topics))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield from clean_text(value.value)


def clean_text(text: str) -> Iterator[str]:
    """Prose sentences from reStructuredText: markup, doctests, code and headings removed."""
    for paragraph in _paragraphs(text):
        joined = " ".join(paragraph)
        joined = _TEX_QUOTE.sub(r'"\1"', joined)
        for pattern in (_ROLE, _LITERAL, _INTERPRETED, _EMPHASIS):
            joined = pattern.sub(r"\1", joined)
        joined = re.sub(r"\s+", " ", joined.replace("::", ":")).strip()
        for sentence in _SENTENCE_END.split(joined):
            if _is_prose(sentence):
                yield sentence


def _paragraphs(text: str) -> Iterator[list[str]]:
    """Blank-line separated blocks of unindented prose lines; code and doctests are dropped."""
    block: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        is_code = raw[:1].isspace() or line.startswith((">>>", "..."))
        if not line or is_code or _DIRECTIVE.match(line) or _UNDERLINE.match(line):
            if block:
                yield block
            block = []
            continue
        block.append(_FIELD.sub("", line))
    if block:
        yield block


def _is_prose(sentence: str) -> bool:
    """At least three words, mostly letters: not a signature, table row or stray code."""
    words = _WORD.findall(sentence)
    letters = sum(len(word) for word in words)
    visible = sum(1 for char in sentence if not char.isspace())
    return len(words) >= 3 and letters >= 0.7 * visible


def _unique(sentences: Iterable[str], seen: set[str]) -> Iterator[str]:
    """Each sentence once over the whole corpus (docstrings repeat: "Return self==value.")."""
    for sentence in sentences:
        if sentence not in seen:
            seen.add(sentence)
            yield sentence


def _write_chunked(out_dir: Path, stem: str, lines: Iterable[str]) -> list[str]:
    """Write lines into ``<stem>-00.txt``, ``<stem>-01.txt``... of about BYTES_PER_FILE each."""
    names: list[str] = []
    chunk: list[str] = []
    size = 0
    for line in lines:
        chunk.append(line)
        size += len(line.encode("utf-8")) + 1
        if size >= BYTES_PER_FILE:
            names.append(_write_chunk(out_dir, stem, len(names), chunk))
            chunk, size = [], 0
    if chunk:
        names.append(_write_chunk(out_dir, stem, len(names), chunk))
    return names


def _write_chunk(out_dir: Path, stem: str, index: int, lines: list[str]) -> str:
    name = f"{stem}-{index:02d}.txt"
    (out_dir / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


def _fingerprint() -> str:
    """What the corpus depends on: this module's version and the interpreter's standard library."""
    return f"v{SAMPLE_VERSION} {sys.version} {sysconfig.get_paths()['stdlib']}"


def _read_marker(dest: Path) -> tuple[str, list[str]] | None:
    """The fingerprint and file names of a finished copy in ``dest``, or None."""
    try:
        marker = json.loads((dest / MARKER).read_text(encoding="utf-8"))
        fingerprint, files = str(marker["fingerprint"]), [str(name) for name in marker["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all((dest / name).is_file() for name in files):
        return None
    return fingerprint, files


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Put ``tmp`` in ``dest``'s place; an older copy is moved aside first, then removed."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        dest.rename(old)
    tmp.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
