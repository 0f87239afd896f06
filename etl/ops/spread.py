"""What Normalize gathers of a column while fitting (``Spread``), and what it concludes from it: the mean and the
population std (``mean_std``), and whether one extreme value dominates the std so much that the normalized values
of most rows collapse into a few float32 numbers (``collapse``).

Every part of a ``Spread`` is combined exactly whatever the order of the batches: per-batch moments kept as a
sorted list and added with ``math.fsum``, counts added, a min and a max. So the fitted numbers, and the warning,
are the same bits on every worker count and executor.

The collapse check costs one pass of counting per batch: the present values are counted by sign and binary
exponent (the top 12 bits of their float64). Once mean and std are known, the values of one such range
``[2**e, 2**(e+1))`` (cut to the column's min and max) all lose their differences when the normalized ends of the
range, as float32, are at most one float32 step apart at unit scale (the spacing of float32 at 1, or at the ends
themselves beyond 1): ``(x - mean) / std`` rounded to float32 never decreases as ``x`` grows, so every value between
the ends lands between their outputs. A column collapses when more than half of its non-zero values lie in such
ranges: one ``1e39`` among the values 1 to 50 makes the std ``1.39e38``, and the fifty become one number. Zeros (and
subnormal numbers) are one value each and are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from etl.errors import FitError

#: How many (sign, binary exponent) ranges a float64 has: its top 12 bits.
RANGES = 4096
_EXPONENT_BITS = 11
_TOP_EXPONENT = (1 << _EXPONENT_BITS) - 1  # infinities and NaN
_BIAS = 1023


def _no_counts() -> np.ndarray:
    return np.zeros(RANGES, np.int64)


@dataclass
class Spread:
    """What Normalize gathers of a column's present values: one (count, sum, sum of squared deviations from the
    batch mean) triple per batch (``moments``, sorted when merged), the count of the values by their top 12 bits
    as float64 (``counts``: sign and binary exponent), their min and max."""

    moments: list[tuple[int, float, float]] = field(default_factory=list)
    counts: np.ndarray = field(default_factory=_no_counts)
    low: float = math.inf
    high: float = -math.inf

    def add(self, moments: tuple[int, float, float], magnitudes: tuple[np.ndarray, float, float]) -> None:
        """Add one batch: its moments (the backend's ``moments``) and its counts, min and max (``magnitudes``)."""
        counts, low, high = magnitudes
        self.moments.append(moments)
        self.counts += counts
        self.low, self.high = min(self.low, low), max(self.high, high)

    def merged(self, other: Spread) -> Spread:
        """The spread of the rows of both."""
        return Spread(sorted(self.moments + other.moments), self.counts + other.counts, min(self.low, other.low), max(self.high, other.high))

    def mean_std(self, column: str) -> tuple[float, float]:
        """Mean and population std (1 when it is 0), combined as the parallel variance formula says; ``FitError``
        naming ``column`` when there is no value, a NaN or infinite one, or values so large that the mean or the
        std is beyond the float64 range."""
        parts = self.moments
        n = sum(p[0] for p in parts)
        if n == 0:
            raise FitError("Normalize", column, "no values to fit")
        nonfinite = int(self.counts[_TOP_EXPONENT] + self.counts[RANGES // 2 + _TOP_EXPONENT])
        if nonfinite:
            raise FitError("Normalize", column, f"{nonfinite:,} of {n:,} values to fit are NaN or infinite "
                           "(invalid input: FillMissing before Normalize reports or quarantines their rows)")  # fmt: skip
        try:
            mean = math.fsum(p[1] for p in parts) / n
            spread = math.fsum(p[0] * (p[1] / p[0] - mean) ** 2 for p in parts)
            var = (math.fsum(p[2] for p in parts) + spread) / n
        except (OverflowError, ValueError):  # a sum beyond the float64 range (fsum raises rather than return inf)
            mean = var = math.inf
        std = math.sqrt(var) or 1.0
        if not (math.isfinite(mean) and math.isfinite(std)):
            raise FitError("Normalize", column, "mean or std beyond the float64 range (values too large; clamp or Log1p first)")
        return mean, std

    def collapse(self, mean: float, std: float) -> str | None:
        """A one-line account of the collapse (see the module docstring) when more than half of the non-zero values
        lie in ranges whose values ``mean`` and ``std`` normalize into float32 numbers at most one step apart at
        unit scale (the spacing of float32 at 1, or at the numbers themselves beyond 1), else None."""
        total = collapsed = 0
        into = [math.inf, -math.inf]  # the float32 numbers the collapsed values are normalized into, from ... to
        for top in np.flatnonzero(self.counts):
            exponent = int(top) & _TOP_EXPONENT
            if exponent in (0, _TOP_EXPONENT):  # zeros and subnormals; NaN and infinities (refused by mean_std)
                continue
            n = int(self.counts[top])
            total += n
            a, b = math.ldexp(1.0, exponent - _BIAS), math.ldexp(2.0 - 2.0**-52, exponent - _BIAS)
            lo, hi = (-b, -a) if top >> _EXPONENT_BITS else (a, b)
            lo, hi = max(lo, self.low), min(hi, self.high)
            if lo >= hi:  # one value: nothing to tell apart
                continue
            with np.errstate(over="ignore"):
                ends = ((np.array([lo, hi]) - mean) / std).astype(np.float32)
            if not np.isfinite(ends).all():  # rows the output check rejects
                continue
            if ends[1] - ends[0] <= np.spacing(max(np.float32(1), *np.abs(ends))):
                collapsed += n
                into = [min(into[0], float(ends[0])), max(into[1], float(ends[1]))]
        if collapsed * 2 <= total:
            return None
        extreme, value = ("max", self.high) if self.high - mean >= mean - self.low else ("min", self.low)
        where = f"one value ({into[0]:.7g})" if into[0] == into[1] else f"[{into[0]:.7g}, {into[1]:.7g}]"
        return (f"normalized values collapse: std {std:.3g} is dominated by {extreme} {value:.3g}; {collapsed:,} of {total:,} "
                f"non-zero values are normalized into {where} (Clamp or Log1p before Normalize)")  # fmt: skip
