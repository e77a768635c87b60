"""Scores over seeds: a task model's score is a mean with a standard deviation, never one lucky
draw.

On small task sets two seeds differ by more than ELMo's gain can, so ELMo and the baseline train
over the same seeds, and a comparison says whether the gain exceeds its standard deviation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

DEFAULT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Scores:
    """One score per seed."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        """The sample standard deviation over seeds (0 for one seed)."""
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def __str__(self) -> str:
        """``0.8123 ± 0.0150``; one seed: ``0.8123``."""
        return f"{self.mean:.4f} ± {self.sd:.4f}" if len(self.values) > 1 else f"{self.mean:.4f}"


def gain_sd(elmo: Scores, baseline: Scores) -> float:
    """The standard deviation of the difference of one draw of each: √(s_elmo² + s_baseline²)."""
    return math.hypot(elmo.sd, baseline.sd)


def difference(elmo: Scores, baseline: Scores) -> str:
    """``gain +0.0650, beyond the gain's standard deviation (0.0512)``, ``... within ...``,
    ``gain +0.0085, every seed scoring the same`` (no standard deviation to judge by), or
    ``gain +0.0650 (one seed: no standard deviation)``, the standard deviation :func:`gain_sd`."""
    gain = elmo.mean - baseline.mean
    if min(len(elmo.values), len(baseline.values)) < 2:
        return f"gain {gain:+.4f} (one seed: no standard deviation)"
    sd = gain_sd(elmo, baseline)
    if sd == 0:
        return f"gain {gain:+.4f}, every seed scoring the same"
    where = "within" if within_spread(elmo, baseline) else "beyond"
    return f"gain {gain:+.4f}, {where} the gain's standard deviation ({sd:.4f})"


def within_spread(elmo: Scores, baseline: Scores) -> bool:
    """Whether the gain, either way, is no larger than its standard deviation :func:`gain_sd`
    (where every seed scores the same: whether there is no gain); False with one seed, where
    there is no standard deviation to judge by."""
    if min(len(elmo.values), len(baseline.values)) < 2:
        return False
    return abs(elmo.mean - baseline.mean) <= gain_sd(elmo, baseline)
