"""Pipelines: a schema plus an ordered list of ops; fit over shards, transform batches, save/load artifacts.

A pipeline file (YAML)::

    name: criteo
    schema: ../schemas/criteo.yaml     # relative to this file
    ops:
      - {op: FillMissing, columns: "@dense", value: 0}
      - {op: Clamp, columns: "@dense", min: 0}
      - {op: Log1p, columns: "@dense"}
      - {op: Decode, columns: "@categorical"}
      - {op: Categorify, columns: "@categorical", freq_threshold: 3}

``columns`` is a list of column names, or ``"@role"`` (every schema column of that role), or a list mixing both.
Every categorical and list column must end as ids (Decode, then Hash or Categorify). The output holds every schema
column, in schema order, then the columns ops create: label and dense as float32, ids as int32 (int64 when an
op's cardinality needs it), lists as list<id>.

Artifacts (a directory): ``pipeline.json`` — format name and version, the pipeline and schema documents, each
op's fitted JSON state, the output columns and their cardinalities — plus ``<op index>-<op>/<table>.parquet``
for fitted tables (vocabularies). Loading never unpickles anything.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.backends import cpu
from etl.batch import Batch, Column, Strings
from etl.errors import ArtifactError, RowError, SpecError
from etl.ops import REGISTRY, InvalidRows, Op
from etl.ids import DESCRIPTION as ID_ENCODING
from etl.ids import id_dtype
from etl.io.files import atomic_write_bytes, atomic_write_parquet
from etl.io.parquet import batch_from_arrow, open_shard
from etl.schema import Schema, load_schema, parse_schema, read_yaml, schema_to_dict
from etl.workers import run_staged

ARTIFACT_FORMAT = "etl-artifacts"
ARTIFACT_VERSION = 1
ON_ERROR = ("raise", "quarantine")


@dataclass
class Rejected:
    """Rows removed from a batch because a value in ``column`` was invalid (``rows`` are file row numbers)."""

    rows: np.ndarray
    column: str
    reason: str


@dataclass
class Transformed:
    batch: Batch
    rejected: list[Rejected] = field(default_factory=list)

    @property
    def num_rejected(self) -> int:
        return sum(len(r.rows) for r in self.rejected)


def _resolve(selector: Any, schema: Schema, path: str, where: str) -> list[str]:
    items = selector if isinstance(selector, list) else [selector]
    out: list[str] = []
    for s in items:
        if not isinstance(s, str):
            raise SpecError(path, where, f"expected a column name or @role, got {s!r}")
        if s.startswith("@"):
            names = schema.by_role(s[1:])
            if not names:
                raise SpecError(path, where, f"the schema has no column with role '{s[1:]}'")
            out.extend(names)
        else:
            out.append(s)
    twice = sorted({c for c in out if out.count(c) > 1})
    if twice:
        raise SpecError(path, where, f"column '{twice[0]}' is selected more than once")
    return out


class Pipeline:
    """An ordered list of ops over a schema. Build with ``Pipeline.from_file`` or ``Pipeline.load``."""

    def __init__(self, doc: dict[str, Any], schema: Schema, path: str = "<memory>", xp: Any = cpu):
        self.doc, self.schema, self.path, self.xp = doc, schema, path, xp
        self.name = str(doc.get("name", schema.name))
        self.ops: list[Op] = []
        raw_ops = doc.get("ops")
        if not isinstance(raw_ops, list) or not raw_ops:
            raise SpecError(path, "ops", "expected a non-empty list of ops")
        specs = {c.name: c for c in schema.columns}
        for i, raw in enumerate(raw_ops):
            where = f"ops[{i}]"
            if not isinstance(raw, dict) or "op" not in raw:
                raise SpecError(path, where, "expected a mapping with an 'op' key")
            cls = REGISTRY.get(raw["op"])
            if cls is None:
                raise SpecError(path, f"{where}.op", f"unknown op {raw['op']!r}; known: {sorted(REGISTRY)}")
            where = f"{where} ({raw['op']})"
            if "columns" not in raw:
                raise SpecError(path, f"{where}.columns", "missing")
            params = {k: v for k, v in raw.items() if k not in ("op", "columns")}
            columns = _resolve(raw["columns"], schema, path, f"{where}.columns")
            try:
                op = cls(columns, **params)
            except TypeError as e:
                raise SpecError(path, where, f"bad parameters: {e}") from None
            except ValueError as e:
                raise SpecError(path, where, str(e)) from None
            op.bind(specs)
            self.ops.append(op)
        self.output_columns = self._check_flow()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: str | Path, xp: Any = cpu) -> Pipeline:
        p = Path(path)
        doc = read_yaml(p)
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise SpecError(str(p), "schema", "expected the path of a schema file")
        schema = load_schema(p.parent / doc["schema"])
        return cls(doc, schema, str(p), xp)

    def _check_flow(self) -> list[str]:
        """Follow each column's kind (raw → keys → ids; numbers) through the ops; return the output columns."""
        kind = _schema_kinds(self.schema)
        order = list(kind)
        for i, op in enumerate(self.ops):
            where = f"ops[{i}] ({op.name}).columns"
            for c in op.columns:
                if c not in kind:
                    raise SpecError(self.path, where, f"no column named '{c}'")
                if op.reads is not None and kind[c] != op.reads:
                    hint = " (put a Decode op before it)" if kind[c] == "raw" else ""
                    raise SpecError(self.path, where, f"column '{c}' holds {kind[c]} values, the op needs {op.reads}{hint}")
            order.extend(c for c in op.outputs if c not in kind)
            _follow(kind, op)
        for c in self.schema.columns:
            if c.role in ("categorical", "list") and kind[c.name] != "ids":
                raise SpecError(self.path, "ops", f"categorical column '{c.name}' is not turned into ids (add Decode, then Hash or Categorify)")
        return order

    # ------------------------------------------------------------------ transform
    @property
    def is_fitted(self) -> bool:
        return all(op.is_fitted for op in self.ops)

    def cardinalities(self) -> dict[str, int]:
        """Embedding table size of every id column."""
        out: dict[str, int] = {}
        for op in self.ops:
            out.update(op.cardinalities())
        return out

    def _apply(self, name: str, t: Transformed, on_error: str, step: Callable[[Batch], dict[str, Column]], xp: Any = None) -> None:
        """Run one step (an op, or a check) with backend ``xp`` (default: the pipeline's); on invalid rows raise
        ``RowError`` or move the rows to ``t.rejected`` and run the step again on the rest."""
        xp = xp or self.xp
        while True:
            try:
                t.batch = t.batch.with_columns(step(t.batch))
                return
            except InvalidRows as e:
                mask = xp.to_numpy(e.mask)
                if not mask.any():
                    raise RuntimeError(f"{name} reported invalid rows in column '{e.column}' but marked none") from e
                if on_error == "raise":
                    raise _row_error(t.batch, e.column, e.reason, mask, xp) from None
                keep = np.flatnonzero(~mask)
                t.rejected.append(Rejected(t.batch.row_ids[mask], e.column, e.reason))
                t.batch = t.batch.take(keep)

    def split(self) -> tuple[list[Op], list[Op]]:
        """The ops as (host part, device part), for transforming after the host→device copy. The host part is
        every op that reads raw values (decoding text needs the variable-length bytes, which stay on the host);
        the device part is the rest (dense ops, Hash, Categorify, crosses, ops on decoded lists), each part in
        pipeline order. The host part then the device part gives the same result as every op in order: an op
        on raw values never reads a column that an op of the device part writes."""
        kind = _schema_kinds(self.schema)
        host: list[Op] = []
        device: list[Op] = []
        for op in self.ops:
            on_raw = op.reads == "raw" or (op.reads is None and all(kind.get(c) == "raw" for c in op.columns))
            (host if on_raw else device).append(op)
            _follow(kind, op)
        return host, device

    def kinds_after(self, ops: list[Op]) -> dict[str, str]:
        """The kind of every column ("number", "raw", "keys", "ids") once ``ops`` (some of this pipeline's ops,
        in its order, e.g. the host part of ``split``) have run."""
        kind = _schema_kinds(self.schema)
        for op in ops:
            _follow(kind, op)
        return kind

    def transform(self, batch: Batch, on_error: str = "raise", part: str = "all", xp: Any = None) -> Transformed:
        """Run every op (the pipeline must be fitted). Invalid rows raise ``RowError`` or, with
        ``on_error="quarantine"``, are left out and listed in ``Transformed.rejected``.

        ``part`` picks the ops of ``split``: ``"host"`` (label check + host part), ``"device"`` (device part +
        output check) or ``"all"``; ``xp`` is the backend (default: the pipeline's). Quarantine takes rows out
        of numpy batches: it needs the CPU backend."""
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if part not in ("all", "host", "device"):
            raise ValueError(f"part must be 'all', 'host' or 'device', got {part!r}")
        if not self.is_fitted:
            raise ArtifactError("the pipeline is not fitted: run fit first or load fitted artifacts")
        xp = xp or self.xp
        host, device = self.split()
        t = Transformed(batch)
        if part != "device":
            self._apply("label check", t, on_error, lambda b: self._check_labels(b, xp), xp)
        for op in {"all": self.ops, "host": host, "device": device}[part]:
            self._apply(op.name, t, on_error, lambda b: op.transform(b, xp), xp)
        if part != "host":
            self._apply("output check", t, on_error, lambda b: self._check_output(b, xp), xp)
        return t

    def _check_labels(self, batch: Batch, xp: Any = None) -> dict[str, Column]:
        """Rows without a usable label are invalid (checked first, so fit and transform skip the same rows)."""
        for c in self.schema.by_role("label"):
            col = batch.columns.get(c)
            if col is None:
                continue
            if col.null_count():
                raise InvalidRows(c, ~col.valid, "label is missing")
            bad = (xp or self.xp).nonfinite_mask(col.values, None)
            if bad is not None:
                raise InvalidRows(c, bad, "label is NaN or infinite")
        return {}

    def _check_output(self, batch: Batch, xp: Any = None) -> dict[str, Column]:
        names = [c for c in self.output_columns if not isinstance(batch[c].values, Strings)]
        found = (xp or self.xp).first_nonfinite([(batch[c].values, batch[c].valid) for c in names])
        if found is not None:
            raise InvalidRows(names[found[0]], found[1], "value is NaN or infinite after the transform")
        return {}

    def transform_table(self, table: pa.Table) -> pa.Table:
        """Transform one in-memory Arrow table of raw rows (the serving path); invalid values raise ``RowError``
        naming the row within ``table``."""
        return self.to_arrow(self.transform(batch_from_arrow(table, self.schema, "<table>")).batch)

    def output_schema(self) -> pa.Schema:
        """Arrow schema of the output: float32 label/dense, int32/int64 ids by cardinality, list<id> lists."""
        cards = self.cardinalities()
        fields = []
        for c in self.output_columns:
            if c in cards:
                t = pa.from_numpy_dtype(id_dtype(cards[c]))
                fields.append(pa.field(c, pa.list_(t) if self._is_list(c) else t, nullable=False))
            else:
                fields.append(pa.field(c, pa.float32()))
        return pa.schema(fields)

    def _is_list(self, c: str) -> bool:
        return c in self.schema.names and self.schema.column(c).is_list

    def to_arrow(self, batch: Batch) -> pa.Table:
        """The output table of a transformed batch, typed by ``output_schema``."""
        schema = self.output_schema()
        arrays = []
        for f in schema:
            col = batch[f.name]
            mask = None if col.valid is None else ~col.valid
            if col.is_list:
                values = pa.array(col.values.astype(f.type.value_type.to_pandas_dtype(), copy=False), mask=mask)
                arrays.append(pa.ListArray.from_arrays(pa.array(col.offsets.astype(np.int32)), values, type=f.type))
            else:
                arrays.append(pa.array(col.values.astype(f.type.to_pandas_dtype(), copy=False), mask=mask))
        return pa.Table.from_arrays(arrays, schema=schema)

    # ------------------------------------------------------------------ fit
    def fit(self, shards: list[Path], workers: int = 1, on_error: str = "raise", progress: Callable[[int], None] | None = None) -> None:
        """Fit every fittable op, streaming over ``shards`` row group by row group in bounded memory.

        Reading, the label check and the ops that feed the fitted ops (Decode...) run in ``workers`` threads.
        Every prepared batch then goes to ``workers`` fitting threads that share its (op, column) units: each
        thread claims the next unclaimed unit of the batch and adds it to that column's accumulator, under the
        column's lock (one accumulator per column: no duplicated count tables; a busy column is put off while the
        thread claims others, so the work balances whatever the columns cost). Statistics are sums (counts,
        exact float sums) and finalize orders everything canonically, so the fitted state (and the artifact
        bytes) do not depend on shard order, batch order or worker count. Ops that read the output of another
        unfitted op are fitted in a later pass."""
        lock = threading.Lock()
        while not self.is_fitted:
            stage = self._next_stage()
            prep, columns = self._fit_plan(stage)
            fitters = max(1, workers)
            stats = [op.new_stats(self.xp) for op in stage]
            units = [(op, _columns_of(st, c)) for op, st in zip(stage, stats) for c in st]
            unit_locks = [threading.Lock() for _ in units]

            def prepare(path: Path, emit: Callable[[Any], None], stop: threading.Event) -> None:
                shard = open_shard(path, self.schema)
                for i in range(shard.num_row_groups):
                    if stop.is_set():
                        return
                    t = Transformed(shard.read(i, columns))
                    self._apply("label check", t, on_error, self._check_labels)
                    for op in prep:
                        self._apply(op.name, t, on_error, lambda b: op.transform(b, self.xp))
                    emit((t, itertools.count()))  # the batch and its unit claims, shared by the fitting threads
                    if progress is not None:
                        with lock:
                            progress(t.batch.num_rows + t.num_rejected)

            def gather(f: int, item: tuple[Transformed, Iterator[int]]) -> None:
                t, claims = item
                later = []
                for u in claims:  # next() on itertools.count is atomic: each unit is claimed once per batch
                    if u >= len(units):
                        break
                    if unit_locks[u].acquire(blocking=False):
                        self._fit_unit(units[u], unit_locks[u], t)
                    else:
                        later.append(u)
                for u in later:
                    unit_locks[u].acquire()
                    self._fit_unit(units[u], unit_locks[u], t)

            run_staged(shards, workers, fitters, prepare, gather)
            for op, st in zip(stage, stats):
                op.finalize(st, self.xp)

    def _fit_unit(self, unit: tuple[Op, dict[str, Any]], held: threading.Lock, t: Transformed) -> None:
        """Add batch ``t`` to one column's accumulator (``unit``: the op and its one-column stats), then release
        the column's lock ``held``."""
        try:
            op, acc = unit
            op.partial_fit(acc, t.batch, self.xp)
        finally:
            held.release()

    def _next_stage(self) -> list[Op]:
        """Unfitted ops whose inputs do not depend on another unfitted op."""
        stale: set[str] = set()
        stage = []
        for op in self.ops:
            if stale & set(op.columns):
                stale |= set(op.outputs)
            elif not op.is_fitted:
                stage.append(op)
                stale |= set(op.outputs)
        return stage

    def _fit_plan(self, stage: list[Op]) -> tuple[list[Op], list[str]]:
        """What fitting ``stage`` needs: the fitted ops that feed it, in pipeline order, and the columns to read
        (theirs, the stage's and the labels: rows without a label are skipped by fit as by transform).

        An op that does not depend on an unfitted op never writes a column a stage op reads (ops write in place
        what they read, or new columns), so all of them can run before the stage ops gather statistics."""
        needed = set(self.schema.by_role("label"))
        feeding = []
        for op in reversed(self.ops):
            if op in stage or needed & set(op.outputs):
                feeding.append(op)
                needed |= set(op.columns)
        stale: set[str] = set()
        prep = []
        for op in feeding[::-1]:
            if op in stage or stale & set(op.columns):
                stale |= set(op.outputs)
            else:
                prep.append(op)
        return prep, [c for c in self.schema.names if c in needed]

    # ------------------------------------------------------------------ artifacts
    def save(self, directory: str | Path) -> None:
        """Write the fitted state: ``pipeline.json`` plus one Parquet file per fitted table (atomic per file)."""
        if not self.is_fitted:
            raise ArtifactError("cannot save an unfitted pipeline")
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        ops_doc = []
        for i, op in enumerate(self.ops):
            doc, tables = op.state()
            names = {}
            for name, table in tables.items():
                rel = f"{i:02d}-{op.name}/{name}.parquet"
                (d / rel).parent.mkdir(parents=True, exist_ok=True)
                atomic_write_parquet(table, d / rel)
                names[name] = rel
            ops_doc.append({"op": op.name, "state": doc, "tables": names})
        manifest = {
            "format": ARTIFACT_FORMAT,
            "version": ARTIFACT_VERSION,
            "pipeline": self.doc,
            "schema": schema_to_dict(self.schema),
            "output_columns": self.output_columns,
            "cardinalities": self.cardinalities(),
            "id_encoding": ID_ENCODING,
            "ops": ops_doc,
        }
        atomic_write_bytes(d / "pipeline.json", json.dumps(manifest, indent=1, sort_keys=True).encode())

    @classmethod
    def load(cls, directory: str | Path, xp: Any = cpu) -> Pipeline:
        """Rebuild a fitted pipeline from artifacts written by ``save`` (JSON + Parquet only)."""
        d = Path(directory)
        try:
            manifest = json.loads((d / "pipeline.json").read_text())
        except FileNotFoundError:
            raise ArtifactError(f"{d}: no pipeline.json (not an artifacts directory)") from None
        except json.JSONDecodeError as e:
            raise ArtifactError(f"{d / 'pipeline.json'}: invalid JSON: {e}") from None
        if manifest.get("format") != ARTIFACT_FORMAT or manifest.get("version") != ARTIFACT_VERSION:
            raise ArtifactError(f"{d}: artifacts format {manifest.get('format')!r} version {manifest.get('version')!r}, expected {ARTIFACT_FORMAT!r} version {ARTIFACT_VERSION}")
        schema = parse_schema(manifest["schema"], str(d / "pipeline.json"))
        pipe = cls(manifest["pipeline"], schema, str(d / "pipeline.json"), xp)
        for op, entry in zip(pipe.ops, manifest["ops"]):
            tables = {}
            for name, rel in entry["tables"].items():
                try:
                    tables[name] = pq.read_table(d / rel)
                except (OSError, pa.ArrowException) as e:
                    raise ArtifactError(f"{d / rel}: cannot read: {e}") from None
            try:
                op.load_state(entry["state"], tables)
            except (KeyError, ValueError) as e:
                raise ArtifactError(f"{d}: state of {op.name}: {e}") from None
        return pipe


def _schema_kinds(schema: Schema) -> dict[str, str]:
    """The kind of each schema column before any op: label and dense columns hold numbers, the others raw values."""
    return {c.name: ("number" if c.role in ("label", "dense") else "raw") for c in schema.columns}


def _follow(kind: dict[str, str], op: Op) -> None:
    """Update ``kind`` with the columns ``op`` writes (in place: what it reads, unchanged when ``writes`` is None)."""
    for c in op.outputs:
        kind[c] = op.writes or kind.get(c, "raw")


def _columns_of(stats: dict[str, Any], column: str) -> dict[str, Any]:
    """The accumulator of an op restricted to one column (the same per-column entry, so updates are shared)."""
    return {column: stats[column]}


def _row_error(batch: Batch, column: str, reason: str, mask: np.ndarray, xp: Any) -> RowError:
    """The error for the first row of ``mask`` (its value shown as read back to the host)."""
    i = int(np.flatnonzero(mask)[0])
    col = batch[column]
    col = Column(*(None if a is None else xp.to_numpy(a) for a in (col.values, col.valid, col.offsets))).take(np.array([i]))
    value = col.values.to_list() if isinstance(col.values, Strings) else col.values.tolist()
    shown = value if col.is_list else value[0]
    return RowError(batch.source, batch.row_group, int(batch.row_ids[i]), column, f"{reason}: {shown!r}")
