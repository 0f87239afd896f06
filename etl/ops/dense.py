"""Ops on dense (numeric) columns. Values are computed in float64 and written as float32 at the end of the
pipeline, so ``FillMissing(0) → Clamp(min=0) → Log1p`` yields exactly ``float32(ln(1 + max(fill0(x), 0)))``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from etl.backends import Backend
from etl.batch import Batch, Column
from etl.ids import FIRST, id_dtype
from etl.ops.base import InvalidRows, InvalidState, Op, Stats
from etl.ops.spread import Spread


class FillMissing(Op):
    """Replace missing values by ``value`` (default 0). Output: float64 values, no missing entries.

    A present NaN or ±inf is not a missing value: it is invalid input (``InvalidRows``)."""

    name = "FillMissing"
    columnwise = True

    def __init__(self, columns: list[str], value: float = 0.0):
        super().__init__(columns)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"FillMissing.value must be a finite number, got {value!r}")
        self.value = float(value)

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        cols = [batch[c] for c in self.columns]
        found = xp.first_nonfinite([(col.values, col.valid) for col in cols])
        if found is not None:
            raise InvalidRows(self.columns[found[0]], found[1], "value is NaN or infinite")
        return {c: Column(xp.fill_null(col.values, col.valid, self.value)) for c, col in zip(self.columns, cols)}


class Clamp(Op):
    """Limit values to ``[min, max]`` (either bound optional). Missing values stay missing."""

    name = "Clamp"
    columnwise = True

    def __init__(self, columns: list[str], min: float | None = None, max: float | None = None):
        super().__init__(columns)
        if min is None and max is None:
            raise ValueError("Clamp needs min, max or both")
        if min is not None and max is not None and min > max:
            raise ValueError(f"Clamp.min {min} is above Clamp.max {max}")
        self.lo, self.hi = min, max

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        return {c: Column(xp.clamp(batch[c].values, self.lo, self.hi), batch[c].valid) for c in self.columns}


class Log1p(Op):
    """ln(1 + x) in float64. Values below -1 give NaN: clamp first (the DLRM pipeline clamps at 0)."""

    name = "Log1p"
    columnwise = True

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        return {c: Column(xp.log1p(batch[c].values), batch[c].valid) for c in self.columns}


class Normalize(Op):
    """(x - mean) / std with mean and population std fitted over the present values of all shards.

    Fitting gathers an ``etl.ops.spread.Spread`` per column: one (count, sum, sum of squared deviations from the
    batch mean) triple per batch, combined as the parallel variance formula says with every sum added by
    ``math.fsum`` (exactly rounded, so independent of the order of the terms), and the values counted by sign and
    binary exponent: the fitted numbers are the same bits whatever the order in which shards and batches were
    seen. A column whose std is 0 (constant values) is divided by 1; a NaN or infinite value, or values so large
    that the mean or std overflows float64, are refused at fit (``FitError``). A column whose normalized values
    collapse (one extreme value dominates the std: most rows become one float32 number) is fitted, with a warning
    (``fit_warnings``) kept in the state."""

    name = "Normalize"
    columnwise = True
    fittable = True

    def __init__(self, columns: list[str]):
        super().__init__(columns)
        self.mean: dict[str, float] = {}
        self.std: dict[str, float] = {}
        self.warnings: dict[str, str] = {}  # column -> how its normalized values collapse

    @property
    def is_fitted(self) -> bool:
        return bool(self.mean)

    def new_stats(self, xp: Backend, rows: int | None = None) -> Stats:
        return {c: Spread() for c in self.columns}

    def partial_fit(self, stats: Stats, batch: Batch, xp: Backend) -> None:
        for c in stats:
            col = batch[c]
            m = xp.moments(col.values, col.valid)
            if m is not None:
                stats[c].add(m, xp.magnitudes(col.values, col.valid))

    def partials(self, stats: Stats, xp: Backend) -> dict[str, Spread]:
        """Per column: its ``Spread``, the per-batch triples sorted."""
        return {c: Spread().merged(stats[c]) for c in stats}

    def merge(self, a: Spread, b: Spread) -> Spread:
        return a.merged(b)

    def finalize_partials(self, partials: dict[str, Spread], xp: Backend) -> None:
        """Set mean and std of every column ``partials`` holds (``FitError`` when a column has no values, a NaN or
        infinite value, or values so large that the mean or the std is beyond the float64 range: clamp or Log1p
        such a column first), and the warning of a column whose normalized values collapse."""
        for c in partials:
            self.mean[c], self.std[c] = partials[c].mean_std(c)
            found = partials[c].collapse(self.mean[c], self.std[c])
            if found is None:
                self.warnings.pop(c, None)
            else:
                self.warnings[c] = found

    def fit_warnings(self) -> list[str]:
        return [f"{self.name}: column '{c}': {self.warnings[c]}" for c in self.columns if c in self.warnings]

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        return {
            c: Column(xp.normalize(batch[c].values, self.mean[c], self.std[c]), batch[c].valid)
            for c in self.columns
        }

    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        doc: dict[str, Any] = {"mean": self.mean, "std": self.std}
        if self.warnings:  # only then: a state without warnings is the mean and the std alone
            doc["warnings"] = dict(self.warnings)
        return doc, {}

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Take each column's mean (a finite number) and std (a finite number > 0), and the warnings when there are
        (a text for some of the columns); ``InvalidState`` otherwise."""
        mean = {c: _number(doc["mean"], c, "mean") for c in self.columns}
        std = {c: _number(doc["std"], c, "std") for c in self.columns}
        for c in self.columns:
            if not std[c] > 0:
                raise InvalidState(f"Normalize: std of '{c}' is {std[c]!r}, expected a number > 0")
        warnings = doc.get("warnings", {})
        if not isinstance(warnings, dict) or not all(c in self.columns and isinstance(w, str) for c, w in warnings.items()):
            raise InvalidState(f"Normalize: warnings is {warnings!r}, expected a text for some of the columns {self.columns}")
        self.mean, self.std, self.warnings = mean, std, dict(warnings)


def _number(values: Any, column: str, name: str) -> float:
    """``values[column]``, which must be a finite JSON number."""
    if not isinstance(values, dict) or column not in values:
        raise InvalidState(f"Normalize: no {name} for '{column}'")
    x = values[column]
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise InvalidState(f"Normalize: {name} of '{column}' is {x!r}, expected a finite number")
    return float(x)


class Bucketize(Op):
    """Dense value → bucket id. Ids: 0 padding, 1 missing, ``2 + i`` where i is the number of ``boundaries``
    (sorted ascending) that are <= the value. Cardinality: len(boundaries) + 3."""

    name = "Bucketize"
    columnwise = True
    writes = "ids"

    def __init__(self, columns: list[str], boundaries: list[float]):
        super().__init__(columns)
        b = np.asarray(boundaries, dtype=np.float64)
        if b.ndim != 1 or len(b) == 0 or not np.all(np.diff(b) > 0):
            raise ValueError("Bucketize.boundaries must be a non-empty, strictly increasing list of numbers")
        self.boundaries = b

    def cardinalities(self) -> dict[str, int]:
        return {c: FIRST + len(self.boundaries) + 1 for c in self.columns}

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        dt = id_dtype(FIRST + len(self.boundaries) + 1)
        return {c: Column(xp.bucketize(batch[c].values, batch[c].valid, self.boundaries, dt)) for c in self.columns}
