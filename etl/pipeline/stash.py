"""The stash of a single-pass preprocess: the row groups the fit read, kept until the transform writes them.

An entry is one row group of one shard, keyed by (shard index, row group), in one of two forms:

- a prepared ``Batch``: the columns after the ops that ran before fitting (decoded keys with their validity, the
  columns the fit did not touch as read);
- ``RawRows``: the row group as read from the source (an Arrow table, with where it comes from), for row groups
  whose rows are better transformed from scratch (some were rejected while fitting).

A prepared batch is held in memory packed (``Packed``): each integer array in the narrowest integer type that
holds all its values (decoded 8-digit hex keys in 4 bytes, 0/1 labels in 1), each validity array as a bitmap, other
arrays as they are; ``get`` and ``pop`` give back the batch that was put (the same dtypes and values, bit for bit).
For a Criteo row group that is about 155 bytes a row instead of 364: fewer fresh pages to fault in while fitting,
and a budget that holds twice the rows.

Entries stay in memory while the bytes they hold stay within a budget (``--memory-budget``; by default
``default_stash_budget()``, 64 MiB: what the stash holds in memory is held until the fit ends, where a run's memory
peaks, while spilling a packed entry and mapping it back costs little time); an entry that would exceed it is
written to a spill directory instead, as an Arrow IPC file, and memory-mapped when it is read back.
The spill directory is made on the first spill, under a temporary name (``etl.io.files.temporary_path``) inside the directory the stash is given,
so that a run killed before ``close`` leaves a name the next run removes (``etl.io.files.remove_temporaries``);
``close`` removes it with all it holds, and refuses later entries.

A prepared batch is spilled packed, as it is held in memory: a one-row table with one ``large_list`` column per
array (``<column>:<part>``: ``values``, ``valid``, ``offsets``, ``raw``; text as ``data``/``starts``/``ends`` or
``views``), the dtype, length and form of each narrowed or bitmap array in the file's metadata; it is read back
unpacked (arrays held as they were view the mapped file); the batch's source, row group and row numbers come back
with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from etl.batch import Batch, Column, InlineStrings, Strings
from etl.errors import ConfigError
from etl.io.arrow import from_numpy, to_numpy
from etl.io.files import temporary_path

#: The default budget: this fraction of the machine's memory (``MemTotal`` of /proc/meminfo).
DEFAULT_BUDGET_FRACTION = 0.25

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_budget(text: str | int) -> int:
    """A number of bytes from ``text``: digits with an optional binary suffix (``512M``, ``2G``, ``1.5g``,
    ``64KiB``; K, M, G, T are powers of 1024). ``ConfigError`` for anything else."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = _SIZE.fullmatch(str(text))
    if m is None:
        raise ConfigError(f"--memory-budget {text!r}: expected a number of bytes, e.g. 512M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


#: The stash's default budget (``default_stash_budget``).
DEFAULT_STASH_BUDGET = 64 << 20


def default_stash_budget() -> int:
    """The budget of a stash when none is given: ``DEFAULT_STASH_BUDGET``, or ``default_budget()`` when lower.
    Every entry held in memory is held until the fit ends, where a single pass's memory peaks; one spilled (packed)
    costs a write and a read of the page cache, little time beside the read and decoding of its row group."""
    return min(DEFAULT_STASH_BUDGET, default_budget())


def default_budget() -> int:
    """``DEFAULT_BUDGET_FRACTION`` of the memory this process may use: the machine's (``MemTotal`` of
    /proc/meminfo, else the physical page count), or its control group's limit when that is lower (a container)."""
    total = _meminfo_total() or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = _cgroup_limit()
    return int(min(total, limit or total) * DEFAULT_BUDGET_FRACTION)


def _meminfo_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: where cgroup v2 and v1 keep the memory limit of this process's group ("max", or a huge number, when none)
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        return int(text) if text.isdigit() else None
    return None


@dataclass(frozen=True)
class RawRows:
    """The rows of a row group as read from ``source`` (row ``first_row`` onwards, in row group ``row_group``)."""

    table: pa.Table
    source: str
    row_group: int
    first_row: int


#: What the stash holds for a row group.
Entry = Batch | RawRows
Key = tuple[int, int]


class StashClosed(RuntimeError):
    """An entry was put into a stash that was closed (the run is stopping)."""


class Stash:
    """Row groups by (shard index, row group), in memory within ``budget`` bytes, beyond it in a spill directory
    made inside ``directory`` (a local directory). Safe to use from several threads. Use as a context manager, or
    call ``close``."""

    def __init__(self, budget: int, directory: Path):
        self.budget, self.directory = budget, directory
        self.peak_bytes = 0  #: the most bytes held in memory at once
        self.spilled_bytes = 0  #: bytes written to the spill directory
        self._memory: dict[Key, tuple[RawRows | Packed, int]] = {}
        self._spilled: dict[Key, Path] = {}
        self._bytes = 0
        self._dir: Path | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def spill_directory(self) -> Path | None:
        """The spill directory, once something was spilled (None before, and after ``close``)."""
        return self._dir

    def __enter__(self) -> Stash:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, key: Key) -> bool:
        return key in self._memory or key in self._spilled

    def put(self, key: Key, entry: Entry) -> None:
        """Keep ``entry`` under ``key``: in memory when it fits in what is left of the budget, else on disk."""
        held = entry if isinstance(entry, RawRows) else pack(entry)
        size = _held_bytes(held)
        with self._lock:
            if self._closed:
                raise StashClosed("the stash is closed")
            if self._bytes + size <= self.budget:
                self._memory[key] = (held, size)
                self._bytes += size
                self.peak_bytes = max(self.peak_bytes, self._bytes)
                return
            if self._dir is None:
                self._dir = temporary_path(self.directory / "stash")
                self._dir.mkdir()
            path = self._dir / f"{key[0]}-{key[1]}.arrow"
        written = _write(path, held)  # outside the lock: threads spill at once
        with self._lock:
            if self._closed:  # closed while it was written: the directory is gone or going
                path.unlink(missing_ok=True)
                raise StashClosed("the stash is closed")
            self.spilled_bytes += written
            self._spilled[key] = path

    def get(self, key: Key) -> Entry:
        """The entry under ``key`` (a prepared batch unpacked into new arrays, a spilled one read back
        memory-mapped)."""
        with self._lock:
            held = self._memory.get(key)
            path = self._spilled.get(key)
        if held is not None:
            return held[0].batch() if isinstance(held[0], Packed) else held[0]
        if path is None:
            raise KeyError(key)
        return _read(path)

    def pop(self, key: Key) -> Entry:
        """The entry under ``key``, forgotten by the stash (its spill file removed; the mapping lives on in the
        arrays returned until they are dropped)."""
        entry = self.get(key)
        with self._lock:
            held = self._memory.pop(key, None)
            if held is not None:
                self._bytes -= held[1]
            path = self._spilled.pop(key, None)
        if path is not None:
            path.unlink(missing_ok=True)
        return entry

    def close(self) -> None:
        """Forget every entry and remove the spill directory; later ``put`` calls raise ``StashClosed``."""
        with self._lock:
            self._closed = True
            self._memory.clear()
            self._spilled.clear()
            self._bytes = 0
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def entry_bytes(entry: Entry) -> int:
    """The bytes the stash holds in memory for ``entry`` (a prepared batch packed, see ``Packed``)."""
    return _held_bytes(entry if isinstance(entry, RawRows) else pack(entry))


def _held_bytes(held: RawRows | Packed) -> int:
    return int(held.table.nbytes) if isinstance(held, RawRows) else held.nbytes


#: The narrower integer types a stashed integer array may be held in, with their bounds, by dtype kind (signed,
#: unsigned).
_NARROWER = {k: [(np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in ts]
             for k, ts in {"i": (np.int8, np.int16, np.int32), "u": (np.uint8, np.uint16, np.uint32)}.items()}  # fmt: skip


def _held_dtype(a: np.ndarray) -> np.dtype:
    """The dtype ``a`` is held in: the narrowest integer type of its kind that holds every one of its values (so
    that widening it back gives the same values), else its own."""
    if a.dtype.kind not in _NARROWER or a.size == 0:
        return a.dtype
    lo = 0 if a.dtype.kind == "u" else int(a.min())
    hi = int(a.max())
    for t, least, most in _NARROWER[a.dtype.kind]:
        if t.itemsize < a.dtype.itemsize and least <= lo and hi <= most:
            return t
    return a.dtype


@dataclass(frozen=True)
class _Held:
    """One array of a packed batch as held: ``data`` (``count`` values of ``dtype``, in a narrower integer type,
    or as a bitmap when ``bitmap``)."""

    data: np.ndarray
    dtype: np.dtype
    count: int
    bitmap: bool

    @classmethod
    def of(cls, a: np.ndarray, bitmap: bool = False) -> _Held:
        if bitmap:
            return cls(np.packbits(a, bitorder="little"), a.dtype, len(a), True)
        held = _held_dtype(a)
        return cls(a if held == a.dtype else a.astype(held), a.dtype, len(a), False)

    def array(self) -> np.ndarray:
        """The array that was held (the same one when it was held as it was)."""
        if self.bitmap:
            return np.unpackbits(self.data, count=self.count, bitorder="little").view(self.dtype)
        return self.data if self.data.dtype == self.dtype else self.data.astype(self.dtype)


@dataclass(frozen=True)
class Packed:
    """A prepared batch held compactly: every 1-d numeric column (no offsets, no raw text) as its values in their
    ``_held_dtype`` and its validity as a bitmap; the row numbers likewise; other columns (text, lists, keys with
    their raw text) as they are. ``batch()`` gives back the batch that was packed: the same columns, dtypes and
    values."""

    columns: dict[str, tuple[_Held, _Held | None] | Column]
    row_ids: _Held
    num_rows: int
    source: str
    row_group: int

    @property
    def nbytes(self) -> int:
        held = [h for c in self.columns.values() if not isinstance(c, Column) for h in c if h is not None]
        kept = [a for c in self.columns.values() if isinstance(c, Column) for _, a in _parts(c)]
        return int(self.row_ids.data.nbytes) + sum(h.data.nbytes for h in held) + sum(a.nbytes for a in kept)

    def batch(self) -> Batch:
        """The batch that was packed (narrowed arrays widened back into new ones)."""
        columns = {}
        for name, c in self.columns.items():
            if isinstance(c, Column):
                columns[name] = c
            else:
                values, valid = c
                columns[name] = Column(values.array(), None if valid is None else valid.array())
        return Batch(columns, self.num_rows, self.source, self.row_group, self.row_ids.array())


def pack(batch: Batch) -> Packed:
    """``batch`` packed (see ``Packed``): its integer arrays narrowed into new ones, its validity into bitmaps."""
    columns: dict[str, tuple[_Held, _Held | None] | Column] = {}
    for name, col in batch.columns.items():
        v = col.values
        if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "biuf" and col.offsets is None and col.raw is None:
            columns[name] = (_Held.of(v), None if col.valid is None else _Held.of(col.valid, bitmap=True))
        else:
            columns[name] = col
    return Packed(columns, _Held.of(batch.row_ids), batch.num_rows, batch.source, batch.row_group)


def _parts(col: Column) -> list[tuple[str, np.ndarray]]:
    """The arrays of a column by part name (text as its buffers)."""
    out: list[tuple[str, np.ndarray]] = []
    for name, v in (("values", col.values), ("raw", col.raw)):
        if isinstance(v, InlineStrings):
            out.append((f"{name}.views", v.inline_views.reshape(-1)))
        elif isinstance(v, Strings):
            out += [(f"{name}.data", v.data), (f"{name}.starts", v.starts), (f"{name}.ends", v.ends)]
        elif v is not None:
            out.append((name, v))
    if col.valid is not None:
        out.append(("valid", col.valid.view(np.uint8)))
    if col.offsets is not None:
        out.append(("offsets", col.offsets))
    return out


def _write(path: Path, entry: RawRows | Packed) -> int:
    """Write ``entry`` (a prepared batch as held, packed) to a new Arrow IPC file at ``path``; returns its size in
    bytes."""
    if isinstance(entry, RawRows):
        where = {"source": entry.source, "row_group": entry.row_group, "first_row": entry.first_row}
        table = entry.table.replace_schema_metadata({"kind": "raw", "where": json.dumps(where)})
    else:
        arrays: list[np.ndarray] = []
        names: list[str] = []
        held: dict[str, tuple[str, int, bool]] = {}  # the arrays held narrowed or as bitmaps: (dtype, count, bitmap)

        def add(name: str, h: _Held) -> None:
            arrays.append(h.data.view(np.uint8) if h.data.dtype == np.bool_ else h.data)
            names.append(name)
            held[name] = (h.dtype.str, h.count, h.bitmap)

        add("row_ids", entry.row_ids)
        for c, col in entry.columns.items():
            if isinstance(col, Column):
                for part, a in _parts(col):
                    arrays.append(a)
                    names.append(f"{c}:{part}")
            else:
                add(f"{c}:values", col[0])
                if col[1] is not None:
                    add(f"{c}:valid", col[1])
        lists = [pa.LargeListArray.from_arrays(from_numpy(np.array([0, len(a)], np.int64)), from_numpy(a)) for a in arrays]
        where = {"source": entry.source, "row_group": entry.row_group, "num_rows": entry.num_rows, "held": held}
        table = pa.Table.from_arrays(lists, names=names).replace_schema_metadata({"kind": "batch", "where": json.dumps(where)})
    with ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)
    return path.stat().st_size


def _read(path: Path) -> Entry:
    """An entry written by ``_write``: raw rows viewing the memory-mapped file, a prepared batch unpacked (its
    arrays held as they are view the file)."""
    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    meta = table.schema.metadata or {}
    where: dict[str, Any] = json.loads(meta[b"where"])
    if meta[b"kind"] == b"raw":
        return RawRows(table.replace_schema_metadata(None), where["source"], where["row_group"], where["first_row"])
    held = {}
    for name, (dtype, count, bitmap) in where["held"].items():
        data = _array(table.column(name))
        held[name] = _Held(data.view(np.bool_) if np.dtype(dtype) == np.bool_ and not bitmap else data, np.dtype(dtype), count, bitmap)
    parts: dict[str, dict[str, np.ndarray]] = {}
    for name in table.column_names:
        if name not in held:
            c, part = name.split(":", 1)
            parts.setdefault(c, {})[part] = _array(table.column(name))
    columns: dict[str, tuple[_Held, _Held | None] | Column] = {}
    for name in table.column_names:
        c = name.split(":", 1)[0]
        if c in columns or name == "row_ids":
            continue
        columns[c] = (held[f"{c}:values"], held.get(f"{c}:valid")) if f"{c}:values" in held else _column(parts[c])
    return Packed(columns, held["row_ids"], where["num_rows"], where["source"], where["row_group"]).batch()


def _array(col: pa.ChunkedArray) -> np.ndarray:
    """The values of a one-row ``large_list`` column as a numpy array viewing its buffer."""
    return to_numpy(col.chunk(0).values)


def _column(parts: dict[str, np.ndarray]) -> Column:
    """A column from its arrays by part name (``_parts`` inverted)."""

    def text(name: str) -> np.ndarray | Strings | None:
        if f"{name}.views" in parts:
            return InlineStrings(parts[f"{name}.views"].reshape(-1, 4))
        if f"{name}.data" in parts:
            return Strings(parts[f"{name}.data"], parts[f"{name}.starts"], parts[f"{name}.ends"])
        return parts.get(name)

    valid = parts.get("valid")
    raw = text("raw")
    return Column(text("values"), None if valid is None else valid.view(np.bool_), parts.get("offsets"), raw if isinstance(raw, Strings) else None)
