"""Two ops of one's own, fitted on quantiles of number columns: an example of the contract of ``etl.Op``
(docs/custom-ops.md). A pipeline names them as ``{op: "my_ops:Winsorize", columns: [I1, I2], upper: 0.99}``.

Both fit on the exact distribution of each column: per column, its distinct present values and how many times each
was seen (``Counts``). Two such tables merge exactly (integer counts), in any order, so the fit gives the same state
with any number of threads, worker processes or Dask workers; quantiles are then read from the merged table.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

import etl
from etl.batch import Batch, Column
from etl.errors import FitError
from etl.ops.base import InvalidState

#: per column: its distinct finite values (float64, ascending; -0.0 counted as 0.0) and how many times each was
#: seen (int64): plain numpy arrays, so that it pickles anywhere (a Dask worker sends it back to the client)
Counts = tuple[np.ndarray, np.ndarray]


def counts_of(values: np.ndarray) -> Counts:
    """The counts of the finite ``values`` (NaN and infinities are left out)."""
    v = values.astype(np.float64)
    v = v[np.isfinite(v)] + 0.0  # + 0.0 turns -0.0 into 0.0: one value, whatever order the rows came in
    distinct, counts = np.unique(v, return_counts=True)
    return distinct, counts.astype(np.int64)


def merged(a: Counts, b: Counts) -> Counts:
    """The counts of both tables' values: exact, the same whatever the order of merging."""
    distinct, inverse = np.unique(np.concatenate([a[0], b[0]]), return_inverse=True)
    counts = np.zeros(len(distinct), np.int64)
    np.add.at(counts, inverse, np.concatenate([a[1], b[1]]))
    return distinct, counts


def quantile(c: Counts, q: float) -> float:
    """The smallest value with at least a share ``q`` of the values at or below it (0 <= q <= 1)."""
    below = np.cumsum(c[1])
    return float(c[0][np.searchsorted(below, max(1, math.ceil(q * int(below[-1]))))])


class QuantileFit(etl.Op):
    """What both ops share: the fit of one ``Counts`` per column (a base class of this module, not an op itself)."""

    fittable = True

    def new_stats(self, xp: Any, rows: int | None = None) -> dict[str, Counts]:
        return {c: (np.empty(0, np.float64), np.empty(0, np.int64)) for c in self.columns}

    def partial_fit(self, stats: dict[str, Counts], batch: Batch, xp: Any) -> None:
        for c in stats:  # the columns this accumulator holds: the pipeline gives each column its own
            col = batch[c]
            values = xp.to_numpy(col.values)  # the state is built on the host, whatever the backend
            if col.valid is not None:
                values = values[xp.to_numpy(col.valid)]
            stats[c] = merged(stats[c], counts_of(values))

    def partials(self, stats: dict[str, Counts], xp: Any) -> dict[str, Counts]:
        return dict(stats)

    def merge(self, a: Counts, b: Counts) -> Counts:
        return merged(a, b)

    def counts(self, partials: dict[str, Counts], c: str) -> Counts:
        """The merged counts of column ``c``; ``FitError`` when it had no finite value."""
        if not len(partials[c][0]):
            raise FitError(self.name, c, "no finite value to fit")
        return partials[c]


class Winsorize(QuantileFit):
    """Clip each column to the ``[lower, upper]`` quantiles of its values in the fit (defaults 0.01, 0.99).
    Missing values stay missing. State: the two bounds per column, in JSON."""

    def __init__(self, columns: list[str], lower: float = 0.01, upper: float = 0.99):
        super().__init__(columns)
        for name, q in (("lower", lower), ("upper", upper)):
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
                raise ValueError(f"Winsorize.{name} must be a number in [0, 1], got {q!r}")
        if lower >= upper:
            raise ValueError(f"Winsorize.lower {lower} must be below Winsorize.upper {upper}")
        self.lower, self.upper = float(lower), float(upper)
        self.bounds: dict[str, tuple[float, float]] = {}

    @property
    def is_fitted(self) -> bool:
        return len(self.bounds) == len(self.columns)

    def finalize_partials(self, partials: dict[str, Counts], xp: Any) -> None:
        for c in partials:
            counts = self.counts(partials, c)
            self.bounds[c] = (quantile(counts, self.lower), quantile(counts, self.upper))

    def transform(self, batch: Batch, xp: Any) -> dict[str, Column]:
        out = {}
        for c in self.columns:
            lo, hi = self.bounds[c]
            out[c] = Column(xp.clamp(batch[c].values, lo, hi), batch[c].valid)
        return out

    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"bounds": {c: list(b) for c, b in self.bounds.items()}}, {}

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        bounds = doc.get("bounds")
        if not isinstance(bounds, dict) or sorted(bounds) != sorted(self.columns):
            raise ValueError(f"Winsorize: expected the bounds of {self.columns}, got {bounds!r}")
        for c, b in bounds.items():
            if not (isinstance(b, list) and len(b) == 2 and all(isinstance(x, (int, float)) and math.isfinite(x) for x in b) and b[0] <= b[1]):
                raise ValueError(f"Winsorize: bounds of '{c}' are {b!r}, expected [low, high] finite numbers, low <= high")
        self.bounds = {c: (float(b[0]), float(b[1])) for c, b in bounds.items()}


class QuantileBuckets(QuantileFit):
    """Equal-frequency buckets: each column's values become ids by the boundaries that cut its values in the fit
    into ``buckets`` parts of about as many rows (boundaries that coincide are one: a column with few distinct
    values has fewer buckets). Ids as ``Bucketize`` gives them: 1 missing, 2 + the number of boundaries at or below
    the value. State: a Parquet table of boundaries per column."""

    writes = "ids"

    def __init__(self, columns: list[str], buckets: int = 10):
        super().__init__(columns)
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not 2 <= buckets <= 10_000:
            raise ValueError(f"QuantileBuckets.buckets must be an integer in [2, 10000], got {buckets!r}")
        self.buckets = buckets
        self.boundaries: dict[str, np.ndarray] = {}

    @property
    def is_fitted(self) -> bool:
        return len(self.boundaries) == len(self.columns)

    def cardinalities(self) -> dict[str, int]:
        return {c: self.buckets + 2 for c in self.columns}  # 0 padding, 1 missing, at most `buckets` buckets

    def finalize_partials(self, partials: dict[str, Counts], xp: Any) -> None:
        for c in partials:
            counts = self.counts(partials, c)
            cuts = [quantile(counts, i / self.buckets) for i in range(1, self.buckets)]
            self.boundaries[c] = np.unique(np.array(cuts, np.float64))

    def transform(self, batch: Batch, xp: Any) -> dict[str, Column]:
        dtype = np.dtype(np.int32)
        return {c: Column(xp.bucketize(batch[c].values, batch[c].valid, self.boundaries[c], dtype)) for c in self.columns}

    def fitted_params(self) -> dict[str, Any]:
        return {"buckets": self.buckets}

    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {}, {c: pa.table({"boundary": pa.array(b, pa.float64())}) for c, b in self.boundaries.items()}

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        boundaries = {}
        for c in self.columns:
            table = tables.get(c)
            if table is None or table.column_names != ["boundary"] or table.schema.field("boundary").type != pa.float64():
                raise InvalidState(f"QuantileBuckets: expected a table of float64 'boundary' for '{c}'", c if table is not None else None)
            b = table.column("boundary").to_numpy()
            if not 1 <= len(b) < self.buckets or not np.all(np.isfinite(b)) or not np.all(np.diff(b) > 0):
                raise InvalidState(f"QuantileBuckets: boundaries of '{c}' must be 1 to {self.buckets - 1} increasing finite numbers", c)
            boundaries[c] = b
        self.boundaries = boundaries
