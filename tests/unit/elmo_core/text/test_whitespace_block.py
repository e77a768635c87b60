import itertools
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from elmo_core.text import whitespace_block
from elmo_core.text.whitespace_block import (
    split_block_compiled,
    split_block_numpy,
    split_whitespace_block,
)

SPACES = [chr(c) for c in range(0x110000) if f"a{chr(c)}b".split() == ["a", "b"]]
compiled = pytest.param(
    split_block_compiled,
    marks=pytest.mark.skipif(
        whitespace_block.split_and_encode is None, reason="C module not built"
    ),
)
SPLITTERS = [split_block_numpy, compiled]


def _lines_of(text: str) -> list[str]:
    """The lines a block holds: split at ``\\n``, none after a final ``\\n``."""
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def _per_line(split, text: str) -> list[list[str]]:
    block = split(text.encode())
    tokens, bounds = block.tokens.to_pylist(), block.line_offsets.tolist()
    return [tokens[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("split", SPLITTERS)
@pytest.mark.parametrize("end", ["", "\n"])
def test_each_line_splits_as_python_split_for_every_space(split, end):
    lines = [f"é{space}b{space}" for space in SPACES if space != "\n"]
    text = "\n".join(["", "  ", "x\u200by ü\ufeff", *lines, "\u3000last"]) + end
    assert _per_line(split, text) == [line.split() for line in _lines_of(text)]


@pytest.mark.parametrize("split", SPLITTERS)
def test_random_text_splits_as_python_split(split):
    """Spaces next to look-alikes: the lead bytes of a space followed by other continuations."""
    pieces = ["a", "Zz", "é", "東京", "\u00a1", "\u2080", "\u200b", "\u1681", "\u3001", "\x00"]
    pieces += [" ", "\t", "\n", "\n", "\r", "\x1c", "\u00a0", "\u2003", "\u2029", "\u3000"]
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert _per_line(split, text) == [line.split() for line in _lines_of(text)], repr(text)


@pytest.mark.parametrize("split", SPLITTERS)
def test_long_text_splits_as_python_split_across_64_byte_chunks(split):
    """Tokens and multi-byte spaces running over the compiled pass's 64-byte chunk bounds."""
    pieces = ["a", "Zz", "word", "é", "東京", "\u2080", "x" * 70, "\u00a0", "\u2003", "\u3000"]
    pieces += [" ", " ", "\t", "\n", "\n\n", "\u2029", "\x1f", "\u0085"]
    rng = random.Random(2)
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(20, 120)))
        assert _per_line(split, text) == [line.split() for line in _lines_of(text)], repr(text)


def test_compiled_tokens_are_dictionary_encoded_as_arrow_does():
    if whitespace_block.split_and_encode is None:
        pytest.skip("C module not built")
    words = [f"w{i % 997}é{'x' * (i % 23)}" for i in range(20_000)]  # short and > 8-byte tokens
    text = "\n".join(" ".join(words[i : i + 7]) for i in range(0, len(words), 7)) + "\n"
    tokens = split_block_compiled(text.encode()).tokens
    expected = pc.dictionary_encode(pa.array(words))
    assert tokens.dictionary.equals(expected.dictionary)
    assert np.array_equal(tokens.indices.to_numpy(), expected.indices.to_numpy())


def test_compiled_module_is_built_where_a_compiler_is():
    """The install builds it wherever it can; without it prepare is ~2x slower, not wrong."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert whitespace_block.split_and_encode is not None


def test_invalid_utf8_is_refused():
    assert split_whitespace_block(b"ok\n\xff bad\n") is None
    assert split_whitespace_block(b"") is not None


@pytest.mark.parametrize("compiled_path", [False, True], ids=["numpy", "compiled"])
def test_any_invalid_utf8_is_refused_and_valid_text_never(compiled_path, monkeypatch):
    """Pieces of characters (split around spaces too), which only the whole block may reveal."""
    if compiled_path and whitespace_block.split_and_encode is None:
        pytest.skip("C module not built")
    if not compiled_path:
        monkeypatch.setattr(whitespace_block, "split_and_encode", None)
    pieces = [
        b"a",
        b" ",
        b"\n",
        b"\xc2\xa0",
        b"\xe2\x80",
        b"\xa6",
        b"\xc2",
        b"\x85",
        b"\xe3\x80\x80",
    ]
    pieces += [b"\xf0\x9f\x98", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", "é東".encode()]
    rng = random.Random(1)
    for _ in range(2000):
        block = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        try:
            block.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert (split_whitespace_block(block) is not None) == valid, block
