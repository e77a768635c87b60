"""Training-set fractions for the sample-efficiency curve (Peters et al. 2018, §5.5, Figure 1).

One seed's subsets are nested (prefixes of one shuffled order), so the curve reads as data added,
not as unrelated draws. Each label keeps ``floor(fraction × count)`` of its examples (tagging:
of the sentences), so rare labels are not over-represented.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from elmo_core.errors import ConfigError, DataError
from elmo_core.tasks.dataset import Example

_ROUNDING_SLACK = 1e-9  # 0.29 × 100 is 28.999999999999996 in floating point: count it as 29


def subsample(
    examples: Sequence[Example], fraction: float, seed: int, *, task_name: str = "task"
) -> list[int]:
    """Indices (ascending) of the ``fraction`` subset of ``examples`` drawn with ``seed``.

    Deterministic for a seed and nested across fractions (module docstring). Raises
    :class:`DataError` when the fraction leaves a label (or the split) with no example.
    """
    groups = _groups(examples, task_name)
    sizes = _subset_sizes(groups, fraction, task_name)
    shuffler = np.random.default_rng(seed)
    chosen: list[int] = []
    for label in sorted(groups, key=str):  # a fixed order: draws do not depend on dict order
        order = shuffler.permutation(np.array(groups[label], dtype=np.int64))
        chosen += order[: sizes[label]].tolist()
    return sorted(chosen)


def check_fractions(
    examples: Sequence[Example], fractions: Iterable[float], task_name: str
) -> None:
    """Fail before any work if one of ``fractions`` is outside (0, 1] or empties a label."""
    groups = _groups(examples, task_name)
    for fraction in sorted(fractions):  # the smallest fraction is the one that fails first
        _subset_sizes(groups, fraction, task_name)


def smallest_fraction(count: int) -> float:
    """``1 / count`` rounded up to 3 significant digits (1/3 → 0.334): keeps one of ``count``."""
    digits = 2 - math.floor(math.log10(1 / count))
    return round(math.ceil(10**digits / count - _ROUNDING_SLACK) / 10**digits, digits)


def _groups(examples: Sequence[Example], task_name: str) -> dict[str | None, list[int]]:
    """Example indices by label; sentences labelled per token all under the single key ``None``."""
    if not examples:
        raise DataError(f"task '{task_name}': no training examples to subsample")
    groups: dict[str | None, list[int]] = {}
    for index, example in enumerate(examples):
        key = None if example.per_token else example.labels()[0]
        groups.setdefault(key, []).append(index)
    if None in groups and len(groups) > 1:
        raise ValueError(f"task '{task_name}': tagged sentences mixed with labelled examples")
    return groups


def _subset_sizes(
    groups: dict[str | None, list[int]], fraction: float, task_name: str
) -> dict[str | None, int]:
    """``floor(fraction × count)`` per group, or the error naming the label it empties."""
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"task '{task_name}': fraction {fraction} is not in (0, 1]")
    sizes = {
        key: math.floor(fraction * len(group) + _ROUNDING_SLACK) for key, group in groups.items()
    }
    empty = [key for key, size in sizes.items() if size == 0]
    if not empty:
        return sizes
    if None in empty:
        num_sentences = len(groups[None])
        raise DataError(
            f"task '{task_name}': fraction {fraction} of {num_sentences} training sentences keeps "
            f"none; the smallest fraction that keeps one is {smallest_fraction(num_sentences)}"
        )
    rarest = min(empty, key=lambda key: (len(groups[key]), str(key)))
    count = len(groups[rarest])
    total = sum(len(group) for group in groups.values())
    others = f" (and {len(empty) - 1} more labels)" if len(empty) > 1 else ""
    raise DataError(
        f"task '{task_name}': fraction {fraction} leaves label '{rarest}' ({count} of {total} "
        f"training examples){others} with no example; the smallest fraction that keeps one of "
        f"every label is {smallest_fraction(min(len(group) for group in groups.values()))}"
    )
