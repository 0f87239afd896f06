"""Ops on categorical values: raw value → uint64 key (Decode) → embedding id (Hash, Categorify, HashedCross).

Id encoding shared by every id-producing op (so one embedding-table convention holds everywhere):

- ``0``: padding (never produced for a value; lists are padded with it downstream);
- ``1``: missing value;
- ``2 ..``: the op's own ids (hash buckets; or OOV buckets then the vocabulary).

The hash, range reduction and string keys are defined in ``etl.backends.hashing``. All ops work on list
(multi-hot) columns too, value by value, keeping the offsets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from etl.backends import Array, Backend, LookupTablesProtocol
from etl.backends.hashing import check_buckets, check_seed
from etl.batch import Batch, Column, Strings
from etl.errors import ConfigError
from etl.ids import RESERVED, id_dtype
from etl.io.arrow import from_numpy, strings, to_numpy
from etl.ops.base import InvalidRows, InvalidState, Op, Stats, rows_with_bad_elements
from etl.ops.counts import KeyCounts, merge_counts
from etl.ops.online_vocab import STATE_ARRAYS, OnlineVocab, VocabularyStream, check_online_params
from etl.ops.stream import StreamInput, StreamSpec, StreamState
from etl.schema import ColumnSpec


class Decode(Op):
    """Raw categorical value → uint64 key, by the column's schema encoding:

    - ``hex``: hexadecimal text (either case; exactly ``width`` digits when the schema gives a width, else 1-16)
      → its integer value, exactly (``"68fd1e64"`` → 0x68FD1E64). Anything else is invalid input.
    - ``int``: an int64 column → its two's-complement bits as uint64 (so -1 → 2**64 - 1); integer text
      (optional sign, 1-20 digits, a value in [-2**63, 2**64 - 1]) → the value itself when non-negative (exactly:
      ``"10000169349117863715"`` → 10000169349117863715), its two's complement when negative (so ``"-1"`` and
      ``"18446744073709551615"`` are the same key). Text outside that range is invalid input. Unsigned 64-bit ids
      are therefore held as text (dtype string) in the raw layout.
    - ``string``: any text → ``string_key`` = fmix64(FNV-1a-64(UTF-8 bytes)).

    Missing values stay missing (``valid`` is kept). A column that already holds keys (one written by
    DateParts) is left as it is."""

    name = "Decode"
    columnwise = True
    reads, writes = "raw", "keys"
    keeps = "keys"

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        out = {}
        for c in self.columns:
            col = batch[c]
            if xp.is_keys(col.values):
                out[c] = col
                continue
            spec = self.specs[c]
            keys, raw, bad = decode_column(col, spec, xp)
            if bad is not None:
                if spec.encoding == "hex":
                    want = f"{spec.width} hex digits" if spec.width else "hex text"
                else:  # only hex and int text can be malformed
                    want = "int text in [-2**63, 2**64 - 1]"
                raise InvalidRows(c, rows_with_bad_elements(col, bad, xp), f"malformed value (expected {want})")
            out[c] = Column(keys, col.valid, col.offsets, raw)
        return out


def decode_column(col: Column, spec: ColumnSpec, xp: Backend) -> tuple[Array, Strings | None, Array | None]:
    """Decode's keys of ``col`` by ``spec``'s encoding: the keys, the text of string keys (else None) and the
    per-value mask of malformed values (None when none can be)."""
    v = col.values
    if not isinstance(v, Strings):
        if spec.encoding != "int":
            raise ValueError(f"column '{spec.name}': {spec.encoding} encoding needs text values")
        return xp.decode_int(v), None, None
    if spec.encoding == "hex":
        keys, bad = xp.decode_hex(v, col.valid, spec.width)
        return keys, None, bad
    if spec.encoding == "int":
        keys, bad = xp.decode_int_text(v, col.valid)
        return keys, None, bad
    return xp.decode_string(v, col.valid), v, None


def render_keys(keys: np.ndarray, spec: ColumnSpec, xp: Backend) -> pa.Array:
    """Canonical raw text of keys decoded with an invertible encoding (hex: lowercase digits, ``width`` of them
    or 16 when the schema gives no width; int: signed decimal)."""
    if spec.encoding == "hex":
        offsets, data = xp.encode_hex(keys, None, spec.width or 16)
        return pa.Array.from_buffers(pa.string(), len(keys), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    if spec.encoding == "int":
        return from_numpy(keys.view(np.int64)).cast(pa.string())
    raise ValueError(f"column '{spec.name}': string keys are not invertible")


def _require_keys(op: str, c: str, col: Column, xp: Backend) -> None:
    if not xp.is_keys(col.values):
        raise ValueError(f"{op}: column '{c}' holds raw values; put a Decode op before it")


class Hash(Op):
    """Key → ``2 + reduce(hash64(key, seed), num_buckets)``; missing → 1. Cardinality ``num_buckets + 2``.

    ``num_buckets`` is 1 .. 2**31. The same key gets the same id on every backend, shard and worker."""

    name = "Hash"
    columnwise = True
    reads, writes = "keys", "ids"

    def __init__(self, columns: list[str], num_buckets: int, seed: int = 0):
        super().__init__(columns)
        check_buckets(num_buckets)
        check_seed(seed)
        self.num_buckets, self.seed = num_buckets, seed

    def cardinalities(self) -> dict[str, int]:
        return {c: self.num_buckets + RESERVED for c in self.columns}

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        cols = [batch[c] for c in self.columns]
        for c, col in zip(self.columns, cols):
            _require_keys(self.name, c, col, xp)
        dt = id_dtype(self.num_buckets + RESERVED)
        ids = xp.hash_columns([col.values for col in cols], [col.valid for col in cols], self.seed, self.num_buckets, dt)
        return {c: Column(i, None, col.offsets) for c, col, i in zip(self.columns, cols, ids)}


class HashedCross(Op):
    """Feature cross of two or more categorical columns, hashed into ``num_buckets``:
    ``2 + reduce(cross_key(k1, ..., km, seed), num_buckets)``, 1 when any input is missing. Writes one new
    column ``name`` (default: the input names joined by ``_x_``). Inputs must be single-valued (not lists)."""

    name = "HashedCross"
    reads, writes = "keys", "ids"

    def __init__(self, columns: list[str], num_buckets: int, seed: int = 0, name: str | None = None):
        super().__init__(columns)
        if len(columns) < 2:
            raise ValueError("HashedCross needs at least two columns")
        check_buckets(num_buckets)
        check_seed(seed)
        self.num_buckets, self.seed = num_buckets, seed
        self.output = name or "_x_".join(columns)

    @property
    def outputs(self) -> list[str]:
        return [self.output]

    def cardinalities(self) -> dict[str, int]:
        return {self.output: self.num_buckets + RESERVED}

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        cols = [batch[c] for c in self.columns]
        for c, col in zip(self.columns, cols):
            _require_keys(self.name, c, col, xp)
            if col.is_list:
                raise ValueError(f"HashedCross: column '{c}' is a list column")
        keys, valid = xp.cross_keys([col.values for col in cols], [col.valid for col in cols], self.seed)
        dt = id_dtype(self.num_buckets + RESERVED)
        return {self.output: Column(xp.bucket_ids(keys, valid, self.num_buckets, dt))}


#: Held while a Categorify builds its lookup tables, so that threads transforming at once build them once (a build
#: happens once per op and backend: one lock for all ops, and none in the op, which stays plain data).
_BUILDING = threading.Lock()

#: The columns and types of a Categorify vocabulary table.
VOCABULARY_SCHEMA = pa.schema([("key", pa.uint64()), ("raw", pa.string()), ("count", pa.int64()), ("id", pa.int64())])


class Categorify(Op):
    """Key → vocabulary id, with the vocabulary fitted over all shards.

    Ids: 0 padding, 1 missing, ``2 .. 2+B-1`` out-of-vocabulary buckets (``B = oov_buckets`` >= 1; an unknown key
    gets ``2 + reduce(hash64(key, seed), B)``), then the vocabulary from ``2 + B``: keys seen at least
    ``freq_threshold`` times, ordered by count descending, ties by key ascending, cut to ``max_size`` entries.
    The ids therefore depend only on the counts, never on shard order or worker count.
    Cardinality: ``2 + B + len(vocabulary)``.

    Fitted state per column: a Parquet table (key uint64, raw string, count int64, id int64) in id order;
    ``raw`` is the value's text (the canonical rendering for hex/int keys, the original text for strings).

    ``online: true`` (with ``capacity`` C, ``admit_after`` T = 1, ``evict`` = ``lfu`` or ``ttl`` with ``ttl_rows``):
    the vocabulary grows while the ``Loader`` streams rows (``etl.ops.online_vocab``): ids ``2 + B .. 2 + B + C -
    1``, cardinality ``2 + B + C`` whatever the keys. The fit (``max_size`` defaults to C) seeds it: the fitted keys
    keep their ids. Such an op gives ids only through the Loader, in row order: ``transform`` raises
    ``ConfigError``; each column's vocabulary is a streaming state (``stream_specs``, ``etl.ops.stream``) named
    after the column, made by the op, the column and the parameters ``capacity``, ``admit_after``, ``evict``,
    ``ttl_rows``, ``oov_buckets`` and ``seed`` (a saved state is refused by a pipeline where one differs)."""

    name = "Categorify"
    columnwise = True
    reads, writes = "keys", "ids"
    fittable = True

    def __init__(self, columns: list[str], freq_threshold: int = 1, max_size: int | None = None, oov_buckets: int = 1, seed: int = 0,
                 online: bool = False, admit_after: int | None = None, capacity: int | None = None, evict: str | None = None,
                 ttl_rows: int | None = None):  # fmt: skip
        super().__init__(columns)
        self.online = _online_settings(online, admit_after, capacity, evict, ttl_rows, max_size)
        if self.online is not None and max_size is None:
            max_size = self.online.capacity
        if not isinstance(freq_threshold, int) or freq_threshold < 1:
            raise ValueError(f"Categorify.freq_threshold must be an integer >= 1, got {freq_threshold!r}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 0):
            raise ValueError(f"Categorify.max_size must be an integer >= 0, got {max_size!r}")
        if not isinstance(oov_buckets, int) or oov_buckets < 1:
            raise ValueError(f"Categorify.oov_buckets must be an integer >= 1, got {oov_buckets!r}")
        check_buckets(oov_buckets)
        check_seed(seed)
        self.freq_threshold, self.max_size, self.oov_buckets, self.seed = freq_threshold, max_size, oov_buckets, seed
        self.vocab: dict[str, pa.Table] = {}
        self._tables: dict[tuple[str, tuple[str, ...]], LookupTablesProtocol] = {}

    @property
    def is_fitted(self) -> bool:
        return bool(self.vocab)

    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        super().bind(specs)
        lists = [c for c in self.columns if c in self.specs and self.specs[c].is_list]
        if self.online is not None and lists:
            raise ValueError(f"Categorify.online: column '{lists[0]}' is a list column; online vocabularies are for single-valued columns")

    def cardinalities(self) -> dict[str, int]:
        if self.online is not None:
            return {c: RESERVED + self.oov_buckets + self.online.capacity for c in self.columns}
        return {c: RESERVED + self.oov_buckets + self.vocab[c].num_rows for c in self.columns}

    def online_vocab(self, column: str) -> OnlineVocab:
        """A new online vocabulary of ``column`` (``online: true`` only), seeded with the fitted vocabulary (its
        first ``capacity`` entries, with their ids)."""
        if self.online is None:
            raise ValueError("Categorify: this op has no online vocabulary (online: false)")
        o = self.online
        vocab = OnlineVocab(o.capacity, o.admit_after, o.evict, o.ttl_rows, self.oov_buckets, self.seed)
        table = self.vocab[column]
        vocab.seed_from(to_numpy(table.column("key")), to_numpy(table.column("count")))
        return vocab

    def stream_specs(self) -> list[StreamSpec]:
        """One online vocabulary per column (none with ``online: false``): it reads the column's keys and writes
        its ids."""
        if self.online is None:
            return []
        o = self.online
        params = {"capacity": o.capacity, "admit_after": o.admit_after, "evict": o.evict, "ttl_rows": o.ttl_rows,
                  "oov_buckets": self.oov_buckets, "seed": self.seed}  # fmt: skip
        return [StreamSpec(c, self.name, c, params, "online vocabulary", (StreamInput(c, np.dtype(np.uint64)),), (c,), ("rows",), STATE_ARRAYS)
                for c in self.columns]  # fmt: skip

    def new_stream_state(self, name: str) -> StreamState:
        """The online vocabulary of column ``name``, seeded with the fitted vocabulary (``online_vocab``)."""
        specs = {s.name: s for s in self.stream_specs()}
        if name not in specs:
            raise ValueError(f"Categorify: no online vocabulary named {name!r} (online columns: {list(specs)})")
        return VocabularyStream(specs[name], self.online_vocab(name))

    # ---- fit
    def new_stats(self, xp: Backend, rows: int | None = None) -> Stats:
        return {c: {"counter": xp.KeyCounter(rows), "nulls": 0, "raw": {}} for c in self.columns}

    def partial_fit(self, stats: Stats, batch: Batch, xp: Backend) -> None:
        for c, s in stats.items():
            col = batch[c]
            _require_keys(self.name, c, col, xp)
            s["counter"].add(col.values, col.valid)
            s["nulls"] += col.null_count()
            if col.raw is not None:
                _remember_raw(s["raw"], col, xp)

    def partials(self, stats: Stats, xp: Backend) -> dict[str, KeyCounts]:
        """Per column ``stats`` holds: every key counted (ascending) with its count, the missing values and, for
        string keys, the texts."""
        return {c: self._counts(stats[c], c, 1) for c in stats}

    def _counts(self, s: dict[str, Any], c: str, threshold: int) -> KeyCounts:
        """The count table of column ``c``'s accumulator ``s``, keys counted fewer than ``threshold`` times left out."""
        keys, counts = s["counter"].at_least(threshold)
        texts = strings([s["raw"][k] for k in keys.tolist()]) if self.specs[c].encoding == "string" else None
        return KeyCounts.of(keys, counts, s["nulls"], texts)

    def finalize(self, stats: Stats, xp: Backend) -> None:
        """``finalize_partials(partials(stats))`` for the columns ``stats`` holds, with the threshold applied by
        the counter (when no partial is merged any more, keys below it can be left out before they are sorted)."""
        for c in stats:
            self.finalize_ranked(c, self.rank(self._counts(stats[c], c, self.freq_threshold)), xp)

    def merge(self, a: KeyCounts, b: KeyCounts) -> KeyCounts:
        return merge_counts([a, b])

    def rank(self, counts: KeyCounts) -> KeyCounts:
        """The vocabulary entries a count table gives: keys counted at least ``freq_threshold`` times, by count
        descending then key ascending, the first ``max_size``."""
        return counts.ranked(self.freq_threshold, self.max_size)

    def finalize_partials(self, partials: dict[str, KeyCounts], xp: Backend) -> None:
        for c in partials:
            self.finalize_ranked(c, self.rank(partials[c]), xp)

    def finalize_ranked(self, column: str, ranked: KeyCounts, xp: Backend) -> None:
        """Set the vocabulary of ``column`` from the ranked table of all rows (``rank`` of the merged partials, or
        the k-way merge of ranked partitions): ids in table order from ``2 + oov_buckets``."""
        keys, counts = ranked.keys, ranked.counts
        if ranked.texts is not None:
            raw = ranked.texts
        else:
            raw = render_keys(keys, self.specs[column], xp)
        ids = np.arange(len(keys), dtype=np.int64) + RESERVED + self.oov_buckets
        table = pa.Table.from_arrays([from_numpy(keys, pa.uint64()), raw, from_numpy(counts, pa.int64()), from_numpy(ids)], schema=VOCABULARY_SCHEMA)
        self.vocab[column] = table.replace_schema_metadata({"nulls": str(ranked.nulls)})
        self._tables = {}

    # ---- transform
    def _lookup_tables(self, xp: Backend) -> LookupTablesProtocol:
        """The lookup tables of every column for backend ``xp``, built once (the first thread to need them builds
        them while the others wait). The op and its copies on some of its columns (``on_columns``) share the cache,
        keyed by backend and columns, so that each copy's tables too are built once."""
        key = (xp.__name__, tuple(self.columns))
        t = self._tables.get(key)
        if t is None:
            with _BUILDING:
                t = self._tables.get(key)
                if t is None:
                    vocabs = [self.vocab[c] for c in self.columns]
                    t = self._tables[key] = xp.LookupTables([(to_numpy(v.column("key")), to_numpy(v.column("id"))) for v in vocabs])
        return t

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        if self.online is not None:
            raise ConfigError(f"Categorify with online: true (columns {self.columns}) gives ids in row order as the Loader streams "
                             "rows (etl.Loader); it cannot transform a batch on its own (etl preprocess, transform_table)")  # fmt: skip
        cols = [batch[c] for c in self.columns]
        for c, col in zip(self.columns, cols):
            _require_keys(self.name, c, col, xp)
        cards = self.cardinalities()
        dtypes = [id_dtype(cards[c]) for c in self.columns]
        ids = self._lookup_tables(xp).lookup([col.values for col in cols], [col.valid for col in cols], RESERVED, self.oov_buckets, self.seed, dtypes)
        return {c: Column(i, None, col.offsets) for c, col, i in zip(self.columns, cols, ids)}

    # ---- artifacts
    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        doc = {"sizes": {c: self.vocab[c].num_rows for c in self.columns}, "cardinalities": self.cardinalities()}
        return doc, {c: self.vocab[c] for c in self.columns}

    def fitted_params(self) -> dict[str, Any]:
        """What a vocabulary table depends on: its keys are those counted ``freq_threshold`` times, cut to
        ``max_size``, and its ids start after the ``oov_buckets``."""
        return {"freq_threshold": self.freq_threshold, "max_size": self.max_size, "oov_buckets": self.oov_buckets}

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Take the vocabulary tables, each checked to be one ``finalize`` could have written (``InvalidState``
        naming the column otherwise)."""
        for c in self.columns:
            if c not in tables:
                raise InvalidState(f"Categorify: no vocabulary for column '{c}'")
            self._check_vocabulary(c, tables[c])
            self.vocab[c] = tables[c]
        self._tables = {}

    def _check_vocabulary(self, c: str, t: pa.Table) -> None:
        """Raise ``InvalidState`` unless ``t`` has the vocabulary columns and types, no missing values, keys seen at
        least ``freq_threshold`` times in count-descending then key-ascending order (so each key once), at most
        ``max_size`` entries, and the ids ``RESERVED + oov_buckets ..`` in row order."""

        def bad(problem: str) -> InvalidState:
            return InvalidState(f"Categorify: vocabulary of '{c}': {problem}", table=c)

        if not t.schema.equals(VOCABULARY_SCHEMA):
            found, expected = ([f"{f.name}: {f.type}" for f in schema] for schema in (t.schema, VOCABULARY_SCHEMA))
            raise bad(f"columns {found}, expected {expected}")
        if any(t.column(name).null_count for name in ("key", "count", "id")):
            raise bad("missing values in key, count or id")
        keys, counts, ids = (to_numpy(t.column(name)) for name in ("key", "count", "id"))
        if len(keys) and counts.min() < self.freq_threshold:
            raise bad(f"a count below freq_threshold {self.freq_threshold}")
        ordered = np.sort(keys)  # a tenth of the time np.unique takes over these keys
        if (ordered[1:] == ordered[:-1]).any():
            raise bad("a key appears more than once")
        in_order = (counts[:-1] > counts[1:]) | ((counts[:-1] == counts[1:]) & (keys[:-1] < keys[1:]))
        if not in_order.all():
            raise bad("entries not ordered by count descending, then key ascending")
        if self.max_size is not None and len(keys) > self.max_size:
            raise bad(f"{len(keys)} entries, more than max_size {self.max_size}")
        first = RESERVED + self.oov_buckets
        if not np.array_equal(ids, np.arange(first, first + len(keys), dtype=np.int64)):
            raise bad(f"ids are not {first} .. {first} + {len(keys) - 1} in row order")


@dataclass(frozen=True)
class OnlineSettings:
    """The parameters of an online Categorify (see ``etl.ops.online_vocab``)."""

    capacity: int
    admit_after: int
    evict: str
    ttl_rows: int | None


def _online_settings(online: object, admit_after: int | None, capacity: int | None, evict: str | None,
                     ttl_rows: int | None, max_size: int | None) -> OnlineSettings | None:  # fmt: skip
    """The online settings (None when ``online`` is false), checked: ``ValueError`` naming the parameter."""
    if not isinstance(online, bool):
        raise ValueError(f"Categorify.online must be true or false, got {online!r}")
    if not online:
        given = [k for k, v in (("admit_after", admit_after), ("capacity", capacity), ("evict", evict), ("ttl_rows", ttl_rows)) if v is not None]
        if given:
            raise ValueError(f"Categorify.{given[0]} is a setting of the online vocabulary: it needs online: true")
        return None
    if capacity is None:
        raise ValueError("Categorify.capacity is required with online: true (the ids of the online vocabulary)")
    settings = OnlineSettings(capacity, 1 if admit_after is None else admit_after, evict or "lfu", ttl_rows)
    check_online_params(settings.capacity, settings.admit_after, settings.evict, settings.ttl_rows)
    if max_size is not None and max_size > capacity:
        raise ValueError(f"Categorify.max_size {max_size} is above capacity {capacity} (the fit seeds the online vocabulary)")
    return settings


def _remember_raw(raw: dict[int, str], col: Column, xp: Backend) -> None:
    """Record the text of keys not seen before (string-encoded columns only)."""
    keys = xp.to_numpy(col.values).view(np.uint64)
    valid = None if col.valid is None else xp.to_numpy(col.valid)
    if valid is not None:
        keys = keys[valid]
    uniq, first = np.unique(keys, return_index=True)
    new = [i for i, k in enumerate(uniq.tolist()) if k not in raw]
    if not new:
        return
    positions = np.flatnonzero(valid) if valid is not None else np.arange(len(keys))
    texts = xp.to_numpy(col.raw).take(positions[first[new]]).to_list()
    for i, t in zip(new, texts):
        raw[int(uniq[i])] = t
