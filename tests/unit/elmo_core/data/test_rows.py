import itertools
import shutil

import numpy as np
import pytest

from elmo_core.data import rows
from elmo_core.data.rows import permute_rows, permute_rows_numpy

compiled = pytest.param(
    permute_rows,
    marks=pytest.mark.skipif(rows.take_rows is None, reason="C module not built"),
)


def _ragged(rng: np.random.Generator, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(0, 9, size=num_rows)  # empty rows included
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, rng.integers(0, 1 << 30, size=offsets[-1], dtype=np.int32)


@pytest.mark.parametrize("permute", [permute_rows_numpy, compiled])
def test_rows_are_taken_in_the_order_given(permute):
    rng = np.random.default_rng(0)
    offsets, values = _ragged(rng, 500)
    order = np.concatenate([rng.permutation(500)[:300], [7, 7]])  # a subset, one row twice
    new_offsets, new_values = permute(offsets, values, order)
    assert new_offsets.dtype == np.int64 and new_offsets[0] == 0
    assert [new_values[a:b].tolist() for a, b in itertools.pairwise(new_offsets)] == [
        values[offsets[row] : offsets[row + 1]].tolist() for row in order
    ]


@pytest.mark.parametrize("permute", [permute_rows_numpy, compiled])
def test_offsets_may_start_inside_the_values(permute):
    """A slice of a larger column: offsets are positions in ``values``, not from 0."""
    values = np.arange(10, dtype=np.int32)
    new_offsets, new_values = permute(np.array([4, 6, 9]), values, np.array([1, 0]))
    assert new_offsets.tolist() == [0, 3, 5]
    assert new_values.tolist() == [6, 7, 8, 4, 5]


@pytest.mark.parametrize("permute", [permute_rows_numpy, compiled])
def test_no_rows(permute):
    new_offsets, new_values = permute(np.array([0]), np.array([], np.int32), np.array([], int))
    assert new_offsets.tolist() == [0] and len(new_values) == 0


def test_compiled_refuses_rows_out_of_range_and_bad_offsets():
    if rows.take_rows is None:
        pytest.skip("C module not built")
    values = np.arange(4, dtype=np.int32)
    with pytest.raises(IndexError, match="order"):
        permute_rows(np.array([0, 2, 4]), values, np.array([2]))
    with pytest.raises(ValueError, match="within the values"):
        permute_rows(np.array([0, 2, 5]), values, np.array([0]))
    with pytest.raises(ValueError, match="fall at row 0"):
        permute_rows(np.array([3, 2, 4]), values, np.array([0]))


def test_compiled_module_is_built_where_a_compiler_is():
    """The install builds it wherever it can; without it the shuffle is slower, not wrong."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert rows.take_rows is not None
