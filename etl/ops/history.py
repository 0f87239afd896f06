"""``History``: each row's point-in-time history, the values its key's earlier events held.

In a pipeline's ops::

    - {op: History, key: userId, time: timestamp, columns: [movieId], max_len: 50, prefix: "hist_"}

For every row it writes, per listed column ``c``, the list ``{prefix}{c}``: the values of ``c`` (as the ops before
History left them: ids of Categorify or Hash) on the rows of the same key whose time is **strictly earlier** than
the row's, the latest ``max_len`` of them, oldest first; and ``{prefix}len`` (int32), their number. The rules:

- ``key``, ``time`` and ``tiebreak`` name schema columns (any role but drop, passthrough ones included), read as
  the schema declares them, before any op: Categorify on the key column before History changes nothing here. The
  key is one value (int64 or text, not a list); two rows have the same key when their keys are equal as Decode
  reads them (``etl.ops.categorical.Decode``: integers and hex text exactly, other text by its 64-bit string hash).
  The time is an int64 column (seconds, milliseconds...: any integer unit; with a schema ``unit``, also a Parquet
  timestamp column, read as its count of that unit: ``etl.io.parquet.in_unit``), compared exactly, never as a float.
- Rows at the same time never see each other. Events are ordered by time, then by the ``tiebreak`` columns (in
  the order listed; missing values first, text by its bytes), then by input position (shards in name order, rows
  in file order): that order decides which events are the latest ``max_len``, and their order in the list. Nothing
  depends on the number of workers or on how the input was cut into shards.
- ``ttl`` (optional): only events within it: ``row time - ttl <= event time < row time``. An integer in the
  time's units, or a duration text (``"30d"``, ``"12h"``, ``"15m"``, ``"90s"``, ``"500ms"``, ``"250us"``, ``"10ns"``,
  ``"2w"``) with
  ``time_unit`` (``s``, ``ms``, ``us`` or ``ns``) saying what the time counts (default: the time column's schema
  ``unit``, which ``time_unit`` must then equal).
- ``columns``: id columns (lists of ids), columns of numbers (label, dense: lists of their float32 values where
  History stands; a row whose value is missing, NaN, infinite or beyond float32 there is invalid: no event) and
  int64 passthrough columns (lists of int64 values as read; a missing one makes the row invalid, checked with the
  label). The loader carries lists of ids only (``check_loadable``).
- ``min_len`` (default 0): rows whose history holds fewer events are dropped (``on_short: drop``, the default:
  counted in the manifest's row accounting as removed by History) or quarantined (``on_short: quarantine``, with
  the reason). Every row that reaches History is an event of its key, short or not.
- A row that the label check or an op before History rejects never reaches it: it is no event (its key's later
  rows do not see it). A row with a missing or malformed key, or a missing time, is invalid (``--on-error``:
  stop naming the file, row and column, or quarantine it); it is checked with the label, before any op
  (``check_sources``), so the fit of the other ops leaves it out too. Rows an op after History rejects are events
  still.
- ``max_keys`` (default 1,000,000) bounds the keys a streaming state keeps (least recently seen evicted); offline
  it changes nothing (``etl.ops.history_state``).

Example (``max_len: 2``; user u's rows in time order, the item column already as ids)::

    time  item   hist_item  hist_len
    10    7      []         0
    20    8      [7]        1
    20    9      [7]        1          same time as the row before: they do not see each other
    30    4      [8, 9]     2          the latest 2 of [7, 8, 9], oldest first (8 before 9: input order)

Where it runs: ``etl preprocess`` (and ``etl fit``, which fits the other ops on the raw rows: History fits nothing)
brings each key's rows together and in order (``etl.preprocess.keyed``) and finds each row's history among the rows
before it (``etl.ops.history_sorted``). The loader on raw shards (also ``follow=True``) drives the same state as a
streaming state (``stream_specs``, ``etl.loader.stream_state``): it takes the rows in the loader's row order, which
must then be each key's time order (``shuffle=False``; each epoch starts from an empty state), and:

- ``allowed_lateness`` (default 0; an integer in the time's units, or a duration text with ``time_unit``): a row
  older than its key's latest event seen by more than it is a row error (the loader stops with a ``RowError``
  naming its file, row group, row and the time column). A row older by at most it ("late") gets the history of
  the events the state still holds strictly before its time (within ``ttl``, the latest ``max_len``): fewer than
  offline when older ones were already dropped, never a later one; its own event then joins the key's state at
  its place in time order (after the events at its time), so that later rows see it as offline; rows given
  before it never do. A late event older than the ``max_len`` events the key holds before its latest time is
  dropped (no later row's latest ``max_len`` would hold it).
- ``max_keys`` bounds the keys held (least recently seen evicted: a key seen again starts empty); evictions are
  counted in the exported state (``evictions``) and in ``Loader.stats.history_evictions``.
- Equal times take the order rows arrive in: ``tiebreak`` is refused, as are ``min_len`` (a batch keeps its rows)
  and ops after History that read or change its columns (they run before the state gives its lists).
On time-ordered input (each key's rows in time order, ``shuffle=False``) the lists equal those of ``etl
preprocess`` row for row. ``Pipeline.transform``, which sees one batch at a time, refuses it (``ConfigError``).
The output lists hold ids of the listed columns' cardinalities; ``{prefix}len`` is an int32 column of cardinality
``max_len + 1``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from etl.backends import Backend, cpu
from etl.batch import Batch, Column
from etl.errors import ConfigError
from etl.ops.base import InvalidRows, Op
from etl.ops.categorical import decode_column
from etl.ops.counts import key_hashes
from etl.ops.history_state import HistoryState, value_array
from etl.ops.stream import Carried, StreamInput, StreamSpec
from etl.schema import ColumnSpec

#: Batch columns the offline run adds for History (names no schema column can have): the key's hash (uint64;
#: missing for a missing or malformed key), and the key and time columns as read.
KEY_HASH = "\0history key hash"
RAW_KEY = "\0history key"
RAW_TIME = "\0history time"
#: What ``on_short`` takes.
ON_SHORT = ("drop", "quarantine")
#: Time units, and the units of duration texts (in nanoseconds).
TIME_UNITS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
DURATION_UNITS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
#: The most entries a history keeps.
MAX_LEN = 1 << 16
#: The largest float32 (a listed number beyond it is invalid).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def event_key_hashes(col: Column, spec: ColumnSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The key column ``spec`` as read (``col``) → each row's key hash (uint64, ``etl.ops.counts.key_hashes`` of
    its Decode key, by the column's encoding, else ``int`` for an int64 column and ``string`` for text; 0 where
    unusable), whether it is usable, and whether it is malformed (present, but not of the column's encoding): the
    key equality of History (and of the split by each key's latest events, ``etl.pipeline.split``)."""
    encoding = spec.encoding or ("int" if spec.dtype == "int64" else "string")
    keys, _, bad = decode_column(col, replace(spec, encoding=encoding), cpu)
    missing = np.zeros(len(col), np.bool_) if col.valid is None else ~col.valid
    malformed = np.zeros(len(col), np.bool_) if bad is None else np.asarray(bad, np.bool_) & ~missing
    usable = ~(missing | malformed)
    return np.where(usable, key_hashes(np.asarray(keys, np.uint64)), np.uint64(0)), usable, malformed


def _positive_int(name: str, v: Any, low: int = 1, high: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"History.{name} must be an integer {span}, got {v!r}")
    return v


def _column_name(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"History.{name} must be a column name, got {v!r}")
    return v


def parse_ttl(ttl: Any, time_unit: Any, lateness: Any = 0) -> int | None:
    """``ttl`` in the time's units: an integer as it is, a duration text (``"30d"``) through ``time_unit``
    (which goes with a duration text in ``ttl`` or in ``lateness``, ``allowed_lateness``)."""
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"History.time_unit must be one of {list(TIME_UNITS)}, got {time_unit!r}")
    if time_unit is not None and not isinstance(ttl, str) and not isinstance(lateness, str):
        if ttl is None:
            raise ValueError("History.time_unit says what a duration text in ttl counts: it goes with a ttl such as '30d'")
        raise ValueError("History.time_unit goes with a duration text in ttl (such as '30d'); an integer ttl is in the time's units")
    return None if ttl is None else parse_duration("ttl", ttl, time_unit, 1)


def parse_duration(name: str, v: Any, time_unit: Any, low: int) -> int:
    """Parameter ``name`` in the time's units (at least ``low``): an integer as it is, a duration text (``"30d"``)
    through ``time_unit``."""
    if isinstance(v, str):
        m = re.fullmatch(r"(\d+)(ns|us|ms|s|m|h|d|w)", v.strip())
        if m is None:
            raise ValueError(f"History.{name} {v!r}: expected an integer or a duration such as '30d', '12h', '15m', '90s', '500ms', '250us', '2w'")
        if time_unit is None:
            raise ValueError(f"History.{name} {v!r} is a duration: give time_unit ({', '.join(TIME_UNITS)}), what the time column counts")
        nanos = int(m[1]) * DURATION_UNITS[m[2]]
        if nanos % TIME_UNITS[time_unit]:
            raise ValueError(f"History.{name} {v!r} is not a whole number of {time_unit}")
        return _positive_int(name, nanos // TIME_UNITS[time_unit], low)
    return _positive_int(name, v, low)


class History(Op):
    """Point-in-time history lists (see the module docstring)."""

    name = "History"
    reads, writes = ("ids", "number"), "ids"
    keyed: ClassVar[bool] = True

    def __init__(self, columns: list[str], key: Any = None, time: Any = None, max_len: Any = None, prefix: Any = "hist_",
                 tiebreak: Any = None, ttl: Any = None, time_unit: Any = None, min_len: Any = 0, on_short: Any = None,
                 max_keys: Any = 1_000_000, allowed_lateness: Any = 0):  # fmt: skip
        super().__init__(columns)
        if not columns:
            raise ValueError("History lists at least one column")
        #: the listed columns, in order: ``columns`` (its inputs: ids and numbers) and the passthrough ones, which
        #: it reads as the schema declares them (``passthrough``, set by ``bind``)
        self.listed = list(columns)
        self.passthrough: list[str] = []
        #: the listed columns of numbers (set by ``bind_kinds``): their lists hold float32 values
        self.numbers: list[str] = []
        self.key = _column_name("key", key)
        self.time = _column_name("time", time)
        if max_len is None:
            raise ValueError("History.max_len is required: the most events a history holds")
        self.max_len = _positive_int("max_len", max_len, 1, MAX_LEN)
        if not isinstance(prefix, str) or not prefix or any(ch in prefix for ch in "/\\\0") or prefix.startswith("."):
            raise ValueError(f"History.prefix must be a non-empty text without '/', '\\', NUL or a leading '.', got {prefix!r}")
        self.prefix = prefix
        tiebreak = [] if tiebreak is None else tiebreak
        if not isinstance(tiebreak, list):
            raise ValueError(f"History.tiebreak must be a list of column names, got {tiebreak!r}")
        self.tiebreak = [_column_name("tiebreak", c) for c in tiebreak]
        order = [self.key, self.time, *self.tiebreak]
        twice = sorted({c for c in order if order.count(c) > 1})
        if twice:
            raise ValueError(f"History: column '{twice[0]}' is named twice among key, time and tiebreak")
        #: ``ttl`` and ``allowed_lateness`` as given: duration texts without ``time_unit`` wait for the time
        #: column's ``unit`` (``bind``)
        self.durations = (ttl, allowed_lateness)
        self.time_unit = time_unit
        self.ttl, self.allowed_lateness = None, 0
        if time_unit is not None or not any(isinstance(v, str) for v in self.durations):
            self.ttl = parse_ttl(ttl, time_unit, allowed_lateness)
            self.allowed_lateness = parse_duration("allowed_lateness", allowed_lateness, time_unit, 0)
        self.min_len = _positive_int("min_len", min_len, 0, self.max_len)
        if on_short is not None and on_short not in ON_SHORT:
            raise ValueError(f"History.on_short must be one of {list(ON_SHORT)}, got {on_short!r}")
        if on_short is not None and self.min_len == 0:
            raise ValueError("History.on_short says what becomes of rows shorter than min_len: it goes with min_len >= 1")
        self.on_short: str = on_short or "drop"
        self.max_keys = _positive_int("max_keys", max_keys)

    # ------------------------------------------------------------------ columns
    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        """Attach the specs; ``ValueError`` for a listed column that is a list or a passthrough column that is not
        int64, a key that is a list or float, a time that is not int64, a tiebreak column that is a list (unknown
        names are the pipeline's to report). The listed passthrough columns leave ``columns`` for
        ``passthrough``: they are read as declared, no op input."""
        self.passthrough = [c for c in self.listed if c in specs and specs[c].role == "passthrough"]
        self.columns = [c for c in self.listed if c not in self.passthrough]
        super().bind(specs)
        for c in self.listed:
            spec = specs.get(c)
            if spec is not None and spec.is_list:
                raise ValueError(f"History: column '{c}' is a list column; a history lists single values")
            if c in self.passthrough and spec is not None and spec.dtype != "int64":
                raise ValueError(f"History: passthrough column '{c}' is {spec.dtype}; a history lists passthrough values of int64 columns only")
        key, time = specs.get(self.key), specs.get(self.time)
        if key is not None and (key.is_list or key.dtype == "float64"):
            raise ValueError(f"History.key: column '{self.key}' is {'a list' if key.is_list else 'float64'}; a key is one int64 or text value")
        if time is not None and (time.is_list or time.dtype != "int64"):
            raise ValueError(f"History.time: column '{self.time}' is {time.dtype}{' list' if time.is_list else ''}; the time is an int64 column")
        if time is not None and time.unit is not None:
            if self.time_unit not in (None, time.unit):
                raise ValueError(f"History.time_unit {self.time_unit!r}: the time column '{self.time}' counts {time.unit} (its schema unit)")
            if self.time_unit is None and any(isinstance(v, str) for v in self.durations):
                self.ttl = None if self.durations[0] is None else parse_duration("ttl", self.durations[0], time.unit, 1)
                self.allowed_lateness = parse_duration("allowed_lateness", self.durations[1], time.unit, 0)
            self.time_unit = time.unit
        elif self.time_unit is None and any(isinstance(v, str) for v in self.durations):
            self.ttl = parse_ttl(self.durations[0], None, self.durations[1])  # a duration text, without a unit: the errors say so
            self.allowed_lateness = parse_duration("allowed_lateness", self.durations[1], None, 0)
        for c in self.tiebreak:
            if c in specs and specs[c].is_list:
                raise ValueError(f"History.tiebreak: column '{c}' is a list column")
        self.source_specs = {c: specs[c] for c in self.source_columns() if c in specs}

    def bind_kinds(self, kinds: dict[str, str]) -> None:
        self.numbers = [c for c in self.columns if kinds[c] == "number"]

    def source_columns(self) -> list[str]:
        return [self.key, self.time, *self.tiebreak, *(c for c in self.passthrough if c not in (self.key, self.time, *self.tiebreak))]

    @property
    def lists(self) -> list[str]:
        """The list columns it writes, one per listed column."""
        return [f"{self.prefix}{c}" for c in self.listed]

    @property
    def value_lists(self) -> list[str]:
        """Its lists of numbers or passthrough values (not ids)."""
        return [f"{self.prefix}{c}" for c in self.listed if c in self.numbers or c in self.passthrough]

    @property
    def length(self) -> str:
        """The column of the histories' lengths."""
        return f"{self.prefix}len"

    @property
    def outputs(self) -> list[str]:
        return [*self.lists, self.length]

    def new_columns(self) -> dict[str, ColumnSpec]:
        """Its lists: of ids (int64 specs), of numbers (float64: the listed column is a label or dense one, unless
        ids by then, as Bucketize makes) or of passthrough values (int64, without an encoding)."""
        out = {}
        for h, c in zip(self.lists, self.listed):
            role = self.specs[c].role if c in self.specs else "categorical"
            if c in self.passthrough:
                out[h] = ColumnSpec(h, "list", "int64", separator=",")
            elif role in ("label", "dense"):
                out[h] = ColumnSpec(h, "list", "float64", separator=",")
            else:
                out[h] = ColumnSpec(h, "list", "int64", "int", separator=",")
        return out

    def cardinalities_given(self, earlier: dict[str, int]) -> dict[str, int]:
        out = {h: earlier[c] for h, c in zip(self.lists, self.listed) if c in earlier}
        out[self.length] = self.max_len + 1
        return out

    # ------------------------------------------------------------------ the state
    @property
    def params_doc(self) -> dict[str, Any]:
        """The parameters the state's meaning depends on (JSON values)."""
        return {"key": self.key, "time": self.time, "columns": list(self.listed), "max_len": self.max_len, "ttl": self.ttl,
                "tiebreak": list(self.tiebreak), "prefix": self.prefix, "max_keys": self.max_keys,
                "allowed_lateness": self.allowed_lateness}  # fmt: skip

    def state_spec(self) -> StreamSpec:
        """Its state (``etl.ops.history_state``): it reads the key's hash, the time and the listed columns, and
        writes the lists and lengths (each list's lengths: ``{prefix}len``); each epoch starts it empty."""
        inputs = (StreamInput(KEY_HASH, np.dtype(np.uint64)), StreamInput(RAW_TIME, np.dtype(np.int64)),
                  *(StreamInput(c, np.dtype(np.int64)) for c in self.listed))  # fmt: skip
        arrays = {"key": np.dtype(np.uint64), "last": np.dtype(np.int64), "time": np.dtype(np.int64)}
        arrays |= {value_array(c): np.dtype(np.int64) for c in self.listed}
        scalars = ("rows", "evictions")
        lengths = {h: self.length for h in self.lists}
        return StreamSpec(f"{self.prefix}*", self.name, self.key, self.params_doc, "history", inputs, tuple(self.outputs), scalars, arrays,
                          lengths, per_epoch=True)  # fmt: skip

    def stream_specs(self) -> list[StreamSpec]:
        """Its state, which the loader drives on raw shards (``etl preprocess`` runs it over sorted rows instead:
        ``etl.preprocess.keyed``)."""
        return [self.state_spec()]

    def new_stream_state(self, name: str, max_keys: int | None = None) -> HistoryState:
        """A new (empty) state; ``max_keys``: the keys it keeps, default the op's."""
        spec = self.state_spec()
        if name != spec.name:
            raise ValueError(f"History: no state named {name!r} (its state is {spec.name!r})")
        return HistoryState(spec, self.key, self.time, self.listed, self.max_len, self.ttl, max_keys or self.max_keys, self.allowed_lateness)

    def check_streamed(self, later: list[Op]) -> None:
        """``ConfigError`` unless the loader can run it as a streaming state (see the module docstring), ``later``
        the ops after it in the pipeline."""
        where = f"History (key '{self.key}', time '{self.time}') on raw shards"
        if self.tiebreak:
            raise ConfigError(f"{where}: rows at the same time take the order they arrive in; tiebreak {self.tiebreak} is for etl preprocess")
        if self.min_len:
            raise ConfigError(f"{where}: min_len {self.min_len} would take rows out of a batch; etl preprocess runs it")
        mine = {*self.listed, *self.outputs}
        for op in later:
            touched = sorted(mine & {*op.columns, *op.outputs})
            if touched:
                raise ConfigError(f"{where}: {op.name} after it reads or writes '{touched[0]}', which the loader's streaming "
                                  "history fills after every other op; run etl preprocess")  # fmt: skip

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        raise ConfigError(f"History (key '{self.key}', time '{self.time}') needs every row of a key, in time order: `etl preprocess` "
                          "brings them together and makes its lists, the Loader on raw shards keeps a state of each key's events; a "
                          "transform of one batch at a time (Pipeline.transform) cannot. Run etl preprocess, then load its output")  # fmt: skip

    # ------------------------------------------------------------------ offline
    def key_hashes(self, col: Column) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The key column as read (``col``) → ``event_key_hashes``: each row's key hash, whether it is usable, and
        whether it is malformed."""
        return event_key_hashes(col, self.source_specs[self.key])

    def with_keys(self, batch: Batch) -> Batch:
        """``batch`` (the schema's columns as read) with the columns its state reads (``with_sources``)."""
        hashes, usable, _ = self.key_hashes(batch[self.key])
        return self.with_sources(batch, hashes, usable)

    def with_sources(self, batch: Batch, hashes: np.ndarray, usable: np.ndarray) -> Batch:
        """``batch`` (the schema's columns as read) with the columns the offline run adds for History: the key
        ``hashes`` (missing where not ``usable``) and the key and time columns as read."""
        return batch.with_columns({KEY_HASH: Column(hashes, None if usable.all() else usable), RAW_KEY: batch[self.key], RAW_TIME: batch[self.time]})

    def check_sources(self, batch: Batch, xp: Backend = cpu) -> None:
        """``InvalidRows`` for the rows of ``batch`` (the schema's columns as read, of backend ``xp``) without a usable
        key (missing, or malformed: not of its encoding) or time (missing): no events (``Op.check_sources``)."""
        key, time = batch.columns.get(self.key), batch.columns.get(self.time)
        if key is not None:
            key = Column(*(None if a is None else xp.to_numpy(a) for a in (key.values, key.valid)))
            _, usable, malformed = self.key_hashes(key)
            if (~usable & ~malformed).any():
                raise InvalidRows(self.key, ~usable & ~malformed, "the key is missing")
            if malformed.any():
                raise InvalidRows(self.key, malformed, f"malformed key (its encoding is {self.source_specs[self.key].encoding})")
        if time is not None and time.valid is not None:
            missing = ~np.asarray(xp.to_numpy(time.valid), np.bool_)
            if missing.any():
                raise InvalidRows(self.time, missing, "the time is missing")
        for c in self.passthrough:
            col = batch.columns.get(c)
            if col is not None and col.valid is not None and not np.asarray(xp.to_numpy(col.valid), np.bool_).all():
                raise InvalidRows(c, ~np.asarray(xp.to_numpy(col.valid), np.bool_), "a listed value is missing")

    def check_numbers(self, batch: Batch) -> None:
        """``InvalidRows`` for the rows of ``batch`` (as the ops before History leave it) whose value of a listed
        column of numbers is missing, NaN, infinite or beyond the float32 range its list holds it in."""
        for c in self.numbers:
            col = batch[c]
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(np.asarray(col.values, np.float64)) <= FLOAT32_MAX)
            if col.valid is not None:
                bad |= ~np.asarray(col.valid, np.bool_)
            if bad.any():
                raise InvalidRows(c, bad, "a listed number is missing, NaN, infinite or beyond float32")

    def carried(self, batch: Batch) -> dict[str, Carried]:
        """What the state takes from a checked batch: the key hashes, times and listed columns' values as int64:
        ids and passthrough values as they are, numbers as the bits of their float32 value."""
        ok = np.ones(batch.num_rows, np.bool_)
        out = {KEY_HASH: Carried(batch[KEY_HASH].array.astype(np.uint64, copy=False), ok),
               RAW_TIME: Carried(batch[RAW_TIME].array.astype(np.int64, copy=False), ok)}  # fmt: skip
        for c in self.listed:
            values = batch[c].array
            if c in self.numbers:
                values = np.asarray(values, np.float32).view(np.int32)
            out[c] = Carried(values.astype(np.int64, copy=False), ok)
        return out

    def output_columns(self, outputs: Mapping[str, np.ndarray], batch: Batch) -> dict[str, Column]:
        """The lists and lengths of ``outputs`` (as a state's ``advance`` gives them) as batch columns: ids in their listed column's dtype, numbers as
        float32, passthrough values as int64."""
        lengths = outputs[self.length]
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        out = {self.length: Column(lengths)}
        for h, c in zip(self.lists, self.listed):
            values = outputs[h]
            values = values.astype(np.int32).view(np.float32) if c in self.numbers else values.astype(batch[c].array.dtype, copy=False)
            out[h] = Column(values, None, offsets)
        return out

    def check_loadable(self) -> None:
        """``ConfigError`` naming its first list of numbers or passthrough values: the loader's batches carry lists
        of ids only."""
        if self.value_lists:
            raise ConfigError(f"column '{self.value_lists[0]}' (History of '{self.value_lists[0][len(self.prefix):]}') holds lists of "
                              f"{'numbers' if self.value_lists[0][len(self.prefix):] in self.numbers else 'passthrough values'}, which the loader's "
                              "batches do not carry (lists of ids only): read it from the Parquet files of etl preprocess, or leave the "
                              "column out of History's columns to load this pipeline")  # fmt: skip


class HistoryNumbers(Op):
    """The check of History's listed numbers where History stands (``History.check_numbers``), as a step
    ``Pipeline.run_ops`` runs (invalid rows raise or go to the quarantine: no events)."""

    name = "History"
    reads = writes = None

    def __init__(self, history: History):
        super().__init__([])
        self.history = history

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        self.history.check_numbers(batch)
        return {}
