"""Synthetic data sets in the raw layout (the same Parquet layout and Arrow types ``etl.io.text`` writes).

Every value is a pure function of ``(seed, column index, file index, row index)``: a counter-based generator
(splitmix64 of a per-column stream key and the row counter, ``etl.tools.draws``) replaces a sequential RNG, so row
groups and files can be generated in any order, on any number of threads, and the same seed gives byte-identical
files. A schema with ``generate.events`` gets a stream of behaviour events instead (``etl.tools.events``).

Shape, per role (each column's parameters are a fixed function of its position in the schema, not of the seed):

* label: int64 → 0/1 with 25 % positives; float64 → ratings 0.5, 1.0, ..., 5.0 with MovieLens-like frequencies.
  Never null.
* dense: heavy-tailed, ``floor(exp(mu + sigma·N(0,1)))`` for int64 (counts, mostly small, a few in the millions),
  ``exp(mu + sigma·N(0,1))`` for float64, with ``mu`` in [0.5, 6.5) and ``sigma`` in [1, 2.5) per column; every
  third column has 3 % negative values (-1..-3 for int64). Null fraction cycles through 20 %, 0, 20 %, 5 %, 45 %,
  5 %, 0, 20 % (Criteo's I-columns are missing 0-78 %).
* categorical: a rank ``r`` in ``[0, K)`` drawn from a Zipf law ``P(r) ∝ (r+1)^-s`` (floor of a continuous Pareto
  on ``[1, K+1)``) mixed with a uniform share ``beta``: ``P(r) = (1-beta)·Zipf + beta/K``. Large-``K`` columns get
  ``s`` → 1.05 and ``beta`` → 0.3, small ones ``s`` → 1.2 and ``beta`` → 0 (the big Criteo columns look like that:
  top key ~5 % of rows, half the keys seen once). Nulls 5-15 % per column. ``K`` (the cardinality) defaults to a
  log-uniform spread over the categorical columns from 10 to ``30·min(rows, 1_000_000)``, or to a fixed
  ``max_cardinality`` (see :func:`default_cardinalities`); on 2 M Criteo rows the largest column shows ~0.9 M distinct keys, the smallest 10.
  A rank becomes a key through a bijection of the key space (``bits``-bit xor-multiply-xorshift permutation salted by
  seed and column), so keys are scattered and distinct ranks give distinct keys.
* passthrough: a row id, ``file · 2**32 + row within the file``, as int64, float64 or decimal text. Never null.
* list: 0-6 elements (weights 5, 30, 25, 18, 12, 6, 4 %); length 0 is written as a null list, as ``convert`` does
  for empty text. Elements are Zipf (s = 1.1) over a small vocabulary of 10-1000 keys.

Encodings: ``hex`` with width ``w`` (8 if unset) → exactly ``w`` lowercase hex digits of a key ``< 16**w``;
``int`` → int64 keys in ``[0, 2**31)``; ``string`` → lowercase ascii words (bijective base-26 of the key, 1-6
letters). Cardinalities are capped by the key space: ``16**w``, ``2**31`` and ``2**28`` respectively.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numba as nb
import numpy as np
import pyarrow as pa

from etl.errors import SpecError
from etl.io.fs import Location
from etl.io.text import ARROW_SCALAR, ROW_GROUP_ROWS, ShardSetWriter, raw_arrow_schema
from etl.runtime.workers import run_workers
from etl.schema import ColumnSpec, Schema
from etl.tools.draws import (
    encode_keys,
    key_bits,
    key_space,
    normal,
    pareto_consts,
    permute,
    stream_key,
    unif,
    validity_bitmap,
    zipf_rank,
)
from etl.tools.events import generate_events

__all__ = ["generate", "default_cardinalities"]

_U = np.uint64
_MAX_LIST = 6
_LIST_LEN_CDF = np.cumsum([0.05, 0.30, 0.25, 0.18, 0.12, 0.06, 0.04])
_RATINGS = np.arange(1, 11) * 0.5
_RATING_CDF = np.cumsum([0.014, 0.028, 0.018, 0.075, 0.055, 0.199, 0.130, 0.266, 0.085, 0.130])
_DENSE_NULLS = (0.2, 0.0, 0.2, 0.05, 0.45, 0.05, 0.0, 0.2)


# ---------------------------------------------------------------------------------------------------------------------
# Python-side helpers (stream keys, per-column parameters)


def _unit(*parts: int) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    return (stream_key(*parts) >> 11) / float(1 << 53)


def _positions(n: int, salt: int) -> list[float]:
    """A deterministic scatter of ``n`` columns over [0, 1]: column j gets t_j (all distinct, evenly spaced)."""
    if n == 1:
        return [1.0]
    order = sorted(range(n), key=lambda j: stream_key(salt, j))
    t = [0.0] * n
    for rank, j in enumerate(order):
        t[j] = rank / (n - 1)
    return t


def default_cardinalities(schema: Schema, rows: int, max_cardinality: int | None = None) -> dict[str, int]:
    """Default cardinality (number of possible keys) of each categorical and list column.

    Categorical columns spread log-uniformly from 10 to ``30·min(rows, 1_000_000)`` (or to ``max_cardinality``
    when given, whatever the number of rows) in a fixed scattered order of column index (Criteo: C1..C26 get 26
    distinct sizes); list columns from 10 to 1000. Capped by the key space of the encoding (``16**width`` for hex,
    ``2**31`` for int).
    """
    out: dict[str, int] = {}
    cats = [c for c in schema.columns if c.role == "categorical"]
    if max_cardinality is not None:
        if not isinstance(max_cardinality, (int, np.integer)) or isinstance(max_cardinality, bool) or max_cardinality < 10:
            raise SpecError("generate", "max_cardinality", f"expected an integer >= 10, got {max_cardinality!r}")
        kmax = float(max_cardinality)
    else:
        kmax = max(10.0, 30.0 * min(max(rows, 1), 1_000_000))
    for c, t in zip(cats, _positions(len(cats), 1)):
        out[c.name] = min(round(10 * (kmax / 10) ** t), key_space(c))
    lists = [c for c in schema.columns if c.is_list]
    for c, t in zip(lists, _positions(len(lists), 2)):
        out[c.name] = min(round(10 * 100**t), key_space(c))
    return out


@dataclass(frozen=True)
class _Plan:
    """Everything needed to generate one column, independent of file and row."""

    index: int
    spec: ColumnSpec
    kind: str  # label_int, label_float, dense_int, dense_float, cat, list, passthrough
    key: int  # per (seed, column) stream key; files and purposes are mixed in later
    null_frac: float = 0.0
    neg_frac: float = 0.0
    mu: float = 0.0
    sigma: float = 1.0
    cardinality: int = 0
    s: float = 1.1
    beta: float = 0.0
    bits: int = 0
    salt: int = 0


def _plans(schema: Schema, rows: int, seed: int, cardinalities: Mapping[str, int] | None, max_cardinality: int | None = None) -> list[_Plan]:
    cards = default_cardinalities(schema, rows, max_cardinality)
    for name, k in (cardinalities or {}).items():
        if name not in cards:
            raise SpecError("cardinalities", name, f"not a categorical or list column of schema '{schema.name}'")
        c = schema.column(name)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= key_space(c):
            raise SpecError("cardinalities", name, f"expected an integer in [1, {key_space(c)}], got {k!r}")
        cards[name] = int(k)
    cats = [c.name for c in schema.columns if c.role == "categorical"]
    cat_t = dict(zip(cats, _positions(len(cats), 1)))
    plans = []
    dense_j = 0
    for i, c in enumerate(schema.columns):
        key = stream_key(seed, i)
        if c.role == "label":
            plans.append(_Plan(i, c, "label_int" if c.dtype == "int64" else "label_float", key))
        elif c.role == "dense":
            j = dense_j
            dense_j += 1
            plans.append(_Plan(
                i, c, "dense_int" if c.dtype == "int64" else "dense_float", key,
                null_frac=_DENSE_NULLS[j % len(_DENSE_NULLS)], neg_frac=0.03 if j % 3 == 1 else 0.0,
                mu=0.5 + 6.0 * _unit(3, j), sigma=1.0 + 1.5 * _unit(4, j),
            ))
        elif c.role == "passthrough":
            plans.append(_Plan(i, c, "passthrough", key))
        else:
            k = cards[c.name]
            if c.role == "categorical":
                t = cat_t[c.name]
                null_frac, s, beta = 0.05 + 0.10 * _unit(5, i), 1.2 - 0.15 * t, 0.3 * t
            else:
                null_frac, s, beta = 0.0, 1.1, 0.0
            plans.append(_Plan(
                i, c, "cat" if c.role == "categorical" else "list", key, null_frac=null_frac,
                cardinality=k, s=s, beta=beta, bits=key_bits(c, k), salt=stream_key(seed, i, 7),
            ))
    return plans


# ---------------------------------------------------------------------------------------------------------------------
# numba kernels (counter-based randomness: value i of a stream is a pure function of (stream key, i))


@nb.njit(nogil=True, cache=True)
def _valid(nkey, i0, n, null_frac, out):
    """out[i] = 1 where row i0+i is not null; returns the number of valid rows."""
    nv = 0
    for i in range(n):
        v = unif(nkey, i0 + i) >= null_frac
        out[i] = v
        nv += v
    return nv


@nb.njit(nogil=True, cache=True)
def _keys(vkey, i0, n, k, s, beta, salt, bits, out):
    c, inv = pareto_consts(k, s)
    for i in range(n):
        out[i] = permute(zipf_rank(unif(vkey, i0 + i), k, beta, c, inv), salt, bits)


@nb.njit(nogil=True, cache=True)
def _dense_int(vkey, nkey_neg, i0, n, mu, sigma, neg_frac, out):
    for i in range(n):
        r = i0 + i
        if neg_frac > 0.0 and unif(nkey_neg, 2 * r) < neg_frac:
            out[i] = -1 - np.int64(unif(nkey_neg, 2 * r + 1) * 3.0)
        else:
            x = math.exp(min(mu + sigma * normal(vkey, r), 36.0))  # e**36 ≈ 4e15 < 2**53
            out[i] = np.int64(x)


@nb.njit(nogil=True, cache=True)
def _dense_float(vkey, nkey_neg, i0, n, mu, sigma, neg_frac, out):
    for i in range(n):
        r = i0 + i
        x = math.exp(min(mu + sigma * normal(vkey, r), 700.0))
        if neg_frac > 0.0 and unif(nkey_neg, 2 * r) < neg_frac:
            x = -x
        out[i] = x


@nb.njit(nogil=True, cache=True)
def _categorical_draw(vkey, i0, n, cdf, out):
    """out[i] = index of the first cdf entry above a uniform (a draw from a small discrete distribution)."""
    for i in range(n):
        u = unif(vkey, i0 + i) * cdf[-1]
        j = 0
        while j < cdf.shape[0] - 1 and u >= cdf[j]:
            j += 1
        out[i] = j


@nb.njit(nogil=True, cache=True)
def _list_keys(vkey, i0, lengths, offsets, k, s, salt, bits, out):
    """Element e of row i0+i uses counter (i0+i)*MAX_LIST + e, so lists do not depend on chunking."""
    c, inv = pareto_consts(k, s)
    for i in range(lengths.shape[0]):
        base = (i0 + i) * _MAX_LIST
        for e in range(lengths[i]):
            out[offsets[i] + e] = permute(zipf_rank(unif(vkey, base + e), k, 0.0, c, inv), salt, bits)


# ---------------------------------------------------------------------------------------------------------------------
# Building Arrow arrays


def _stream(p: _Plan, file: int, purpose: int) -> np.uint64:
    return _U(stream_key(p.key, file, purpose))


def _column(p: _Plan, file: int, i0: int, n: int) -> pa.Array:
    """Rows [i0, i0+n) of column ``p`` in file ``file``."""
    valid = np.ones(n, np.uint8)
    nvalid = n
    if p.null_frac > 0.0:
        nvalid = _valid(_stream(p, file, 1), i0, n, p.null_frac, valid)
    vkey = _stream(p, file, 2)
    if p.kind == "passthrough":
        ids = np.arange(i0, i0 + n, dtype=np.int64) + (file << 32)
        return pa.array(ids).cast(ARROW_SCALAR[p.spec.dtype])
    if p.kind == "label_int":
        out = np.empty(n, np.int64)
        _categorical_draw(vkey, i0, n, np.array([0.75, 1.0]), out)
        return pa.array(out)
    if p.kind == "label_float":
        idx = np.empty(n, np.int64)
        _categorical_draw(vkey, i0, n, _RATING_CDF, idx)
        return pa.array(_RATINGS[idx])
    if p.kind in ("dense_int", "dense_float"):
        out = np.empty(n, np.int64 if p.kind == "dense_int" else np.float64)
        (_dense_int if p.kind == "dense_int" else _dense_float)(
            vkey, _stream(p, file, 3), i0, n, p.mu, p.sigma, p.neg_frac, out)
        t = pa.int64() if p.kind == "dense_int" else pa.float64()
        return pa.Array.from_buffers(t, n, [validity_bitmap(valid, nvalid), pa.py_buffer(out)], null_count=n - nvalid)
    salt, bits = _U(p.salt & ((1 << p.bits) - 1)), p.bits
    if p.kind == "cat":
        keys = np.empty(n, np.uint64)
        _keys(vkey, i0, n, p.cardinality, p.s, p.beta, salt, bits, keys)
        return encode_keys(keys, valid, nvalid, p.spec)
    # list: length 0 → null list
    lengths = np.empty(n, np.int64)
    _categorical_draw(_stream(p, file, 4), i0, n, _LIST_LEN_CDF, lengths)
    lvalid = (lengths > 0).view(np.uint8)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    keys = np.empty(total, np.uint64)
    _list_keys(vkey, i0, lengths, offsets, p.cardinality, p.s, salt, bits, keys)
    values = encode_keys(keys, np.ones(total, np.uint8), total, p.spec)
    nvalid = int(np.count_nonzero(lvalid))
    list_type = pa.list_(pa.field("element", values.type))
    return pa.Array.from_buffers(list_type, n, [validity_bitmap(lvalid, nvalid), pa.py_buffer(offsets)],
                                 null_count=n - nvalid, children=[values])


# ---------------------------------------------------------------------------------------------------------------------


def _write_file(shards: ShardSetWriter, plans: list[_Plan], arrow_schema: pa.Schema, file: int, nrows: int,
                tick: Callable[[int], None]) -> None:
    writer = shards.open(file)
    try:
        for i0 in range(0, nrows, ROW_GROUP_ROWS):
            n = min(ROW_GROUP_ROWS, nrows - i0)
            batch = pa.RecordBatch.from_arrays([_column(p, file, i0, n) for p in plans], schema=arrow_schema)
            writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
            tick(n)
    finally:
        writer.close()


def generate(
    schema: Schema,
    rows: int,
    files: int,
    out_dir: str | Location,
    seed: int = 0,
    cardinalities: Mapping[str, int] | None = None,
    progress: Callable[[int], None] | None = None,
    max_cardinality: int | None = None,
) -> list[Location]:
    """Write ``rows`` synthetic rows of ``schema`` as ``files`` raw-layout shards in ``out_dir``; return their paths.

    Shards are ``part-00000.parquet`` ... with the rows split evenly (the first ``rows % files`` shards get one row
    more; a shard may be empty when ``files > rows``), row groups of at most 131,072 rows, the Arrow schema of
    ``etl.io.text.raw_arrow_schema``. See the module docstring for the distributions. ``cardinalities`` overrides
    the number of possible keys of named categorical/list columns (defaults: :func:`default_cardinalities`);
    ``max_cardinality`` fixes the largest default one, so that data sets of different sizes share the same
    vocabulary sizes (e.g. 2 M and 8 M rows with ``max_cardinality=1_000_000``).

    Deterministic: the same arguments give byte-identical files, whatever the number of threads. Files are written
    in parallel (one thread per file, up to the CPU count) under temporary names and renamed when all are complete;
    other ``part-*.parquet`` files in ``out_dir`` are then removed. ``progress`` is called with the number of rows
    of each row group written (from the writing threads, one call at a time).

    A schema with a ``generate.events`` section gets a stream of behaviour events instead
    (``etl.tools.events.generate_events``, written by one thread; its other columns as here, from the row's position
    in the stream), and ``cardinalities`` may not name the columns the events fill.

    Raises ``SpecError`` for ``rows < 0``, ``files < 1`` or a bad ``cardinalities`` entry.
    """
    if not isinstance(rows, (int, np.integer)) or rows < 0:
        raise SpecError("generate", "rows", f"expected an integer >= 0, got {rows!r}")
    if not isinstance(files, (int, np.integer)) or files < 1:
        raise SpecError("generate", "files", f"expected an integer >= 1, got {files!r}")
    plans = _plans(schema, int(rows), int(seed), cardinalities, max_cardinality)
    if schema.events is not None:
        filled = set(schema.events.filled.values())
        named = sorted(set(cardinalities or {}) & filled)
        if named:
            raise SpecError("cardinalities", named[0], "a column of the events: set generate.events.users, items or categories in the schema")
        others = [p for p in plans if p.spec.name not in filled]  # made from the row's position in the stream

        def other_columns(i0: int, n: int) -> dict[str, pa.Array]:
            return {p.spec.name: _column(p, 0, i0, n) for p in others}

        return generate_events(schema, int(rows), int(files), out_dir, int(seed), other_columns, progress, max_cardinality)
    arrow_schema = raw_arrow_schema(schema)
    sizes = [rows // files + (1 if f < rows % files else 0) for f in range(files)]

    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    with ShardSetWriter(out_dir, arrow_schema) as shards:
        workers = max(1, min(files, os.cpu_count() or 1))
        run_workers(list(range(files)), workers, lambda w, f, stop: _write_file(shards, plans, arrow_schema, f, sizes[f], tick))
        return shards.commit()
