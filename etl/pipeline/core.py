"""Pipelines: a schema plus an ordered list of ops, and the transform of one batch.

A pipeline file (YAML)::

    name: criteo
    schema: ../schemas/criteo.yaml     # relative to this file
    stages:                            # optional: reshaping stages on the raw rows (etl.pipeline.stages)
      - {stage: Filter, where: {column: label, op: not_null}}
    ops:
      - {op: FillMissing, columns: "@dense", value: 0}
      - {op: Clamp, columns: "@dense", min: 0}
      - {op: Log1p, columns: "@dense"}
      - {op: Decode, columns: "@categorical"}
      - {op: Categorify, columns: "@categorical", freq_threshold: 3}

``columns`` selects the op's input columns. It is a column name, ``"@role"`` (every schema column of that role,
then the columns of that role created by earlier ops: DateParts creates categorical ones), ``{role: R, exclude:
[names]}`` (the same but the excluded ones, which must be of role R), or a list mixing these (a column selected
twice is an error)::

    - {op: Decode, columns: "@categorical"}
    - {op: Categorify, columns: {role: categorical, exclude: [device_ip]}, freq_threshold: 2}
    - {op: Hash, columns: [device_ip], num_buckets: 1000000}

Columns of role ``passthrough`` are never op inputs: selecting one (by name or by role) is a SpecError. (An op's
``source_columns``, History's key, time and tiebreak columns, may be any schema column: they are read as the schema
declares them, not transformed.) Every
categorical and list column must end as ids (Decode, then Hash or Categorify). The output holds every schema
column (dropped ones aside), in schema order, then the columns ops create, in pipeline order: label and dense as
float32, ids as int32 (int64 when an op's cardinality needs it), lists as list<id>, passthrough columns unchanged
in their raw-layout type (``etl.io.text.raw_arrow_schema``). Ops and their parameters are documented in
``pipelines/README.md``.

``split`` (optional) says which rows are train, valid and test rows for ``etl preprocess``, which then fits every
statistic on the train rows only and writes each split apart (``etl.pipeline.split``; ``Pipeline.split_spec``).

``stages`` (optional) lists reshaping stages, which run on the raw rows before the fit and the ops and may change
the row count; ``etl preprocess`` runs them, and ``Pipeline.transform`` does not (see ``etl.pipeline.stages``).
``Groupby`` (``etl.pipeline.groupby``), a reshaping stage of key scope, is written as the last entry of ``ops``:
the ops before it transform the events (and are fitted on them), and the output holds one row per group instead,
its columns those of Groupby (``output_columns``; ``event_columns`` are those the ops leave).

Fitting over shards is in ``etl.pipeline.fit``, saving and loading the fitted state in ``etl.pipeline.artifacts``;
``Pipeline.fit``, ``save`` and ``load`` call them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import numpy as np
import pyarrow as pa

from etl.backends import cpu
from etl.batch import Batch, Column, Strings
from etl.errors import ArtifactError, ConfigError, InputError, RowError, SpecError, did_you_mean
from etl.ids import id_dtype
from etl.io.arrow import from_numpy, validity
from etl.io.fs import Location
from etl.io.memory import SOURCE, arrow_table
from etl.io.parquet import batch_from_arrow
from etl.io.processed import StageRows
from etl.io.text import raw_arrow_schema
from etl.ops import InvalidRows, Op
from etl.pipeline import artifacts
from etl.pipeline.entries import PIPELINE_DOCS, check_parameters, op_class
from etl.pipeline.fit import fit_shards
from etl.pipeline.groupby import Groupby
from etl.pipeline.split import Split, canonical, parse_split
from etl.pipeline.split_rows import SplitStage
from etl.pipeline.stages import Stage, parse_stages
from etl.resources import resolve, resolve_schema_of
from etl.runtime.progress import Progress
from etl.schema import ColumnSpec, Schema, load_schema, read_yaml

if TYPE_CHECKING:
    from distributed import Client

#: What to do with a row holding an invalid value: raise ``RowError``, or leave the row out and list it.
OnError = Literal["raise", "quarantine"]
ON_ERROR: tuple[OnError, ...] = get_args(OnError)

#: Which ops ``transform`` runs: all of them, or the host or the device part of ``Pipeline.split``.
Part = Literal["all", "host", "device"]
PARTS: tuple[Part, ...] = get_args(Part)

#: A backend namespace (``etl.backends.cpu`` or ``etl.backends.tensor``): the type of every ``xp`` parameter.
Backend: TypeAlias = Any

#: One step of a transform: an op's ``transform`` (returns the columns it writes) or a check (returns None); both
#: raise ``InvalidRows`` on invalid values.
Step: TypeAlias = Callable[[Batch], dict[str, Column] | None]


@dataclass
class Rejected:
    """Rows removed from a batch because a value in ``column`` was invalid (``rows`` are file row numbers)."""

    rows: np.ndarray
    column: str
    reason: str


@dataclass
class Transformed:
    """A transformed batch and the rows left out of it (with ``on_error="quarantine"``); ``stages``: when the
    batch was read through the pipeline's reshaping stages, the rows each took in and passed on."""

    batch: Batch
    rejected: list[Rejected] = field(default_factory=list)
    stages: tuple[StageRows, ...] = ()

    @property
    def num_rejected(self) -> int:
        return sum(len(r.rows) for r in self.rejected)

    @property
    def rows_read(self) -> int:
        """The rows the batch was made from: those read, before the stages, when it went through stages; else its
        rows and the rejected ones."""
        return self.stages[0].rows_in if self.stages else self.batch.num_rows + self.num_rejected


def _resolve(selector: Any, schema: Schema, created: dict[str, ColumnSpec], path: str, where: str) -> list[str]:
    """The column names a ``columns`` selector names (see the module docstring); role selectors take the schema's
    columns of that role, then those of ``created`` (columns earlier ops create)."""
    items = selector if isinstance(selector, list) else [selector]
    out: list[str] = []
    for s in items:
        if isinstance(s, dict):
            out.extend(_role_columns(s, schema, created, path, where))
        elif isinstance(s, str) and s.startswith("@"):
            out.extend(_role_columns({"role": s[1:]}, schema, created, path, where))
        elif isinstance(s, str):
            out.append(s)
        else:
            raise SpecError(path, where, f"expected a column name, @role or {{role: R, exclude: [...]}}, got {s!r}")
    twice = sorted({c for c in out if out.count(c) > 1})
    if twice:
        raise SpecError(path, where, f"column '{twice[0]}' is selected more than once")
    return out


def _resolve_crosses(selector: Any, schema: Schema, created: dict[str, ColumnSpec], path: str, where: str) -> list[Any]:
    """The inputs of an op whose ``columns`` may name crosses (``Op.crosses``): each entry of the list that is itself
    a list of column names is one input (those names, resolved), every other entry resolves as ``_resolve`` resolves
    it, to one input per column."""
    items = selector if isinstance(selector, list) else [selector]
    out: list[Any] = []
    for j, s in enumerate(items):
        if isinstance(s, list):
            out.append(_resolve(s, schema, created, path, f"{where}[{j}]"))
        else:
            out.extend(_resolve(s, schema, created, path, where))
    return out


def _role_columns(sel: dict[str, Any], schema: Schema, created: dict[str, ColumnSpec], path: str, where: str) -> list[str]:
    """The columns of a role selector ``{role: R, exclude: [...]}``: every schema column of role R, in schema
    order, then those of ``created`` (in creation order), but the excluded ones."""
    unknown = sorted(set(sel) - {"role", "exclude"})
    if unknown:
        raise SpecError(path, f"{where}.{unknown[0]}", "unknown field of a role selector (it has role and exclude)")
    role, exclude = sel.get("role"), sel.get("exclude", [])
    if not isinstance(role, str):
        raise SpecError(path, f"{where}.role", f"expected a role name, got {role!r}")
    if role in ("passthrough", "drop"):
        what = "copied to the output unchanged" if role == "passthrough" else "not read"
        raise SpecError(path, where, f"columns of role {role} are {what}: no op reads them")
    if not isinstance(exclude, list) or not all(isinstance(c, str) for c in exclude):
        raise SpecError(path, f"{where}.exclude", f"expected a list of column names, got {exclude!r}")
    names = schema.by_role(role) + [c.name for c in created.values() if c.role == role]
    if not names:
        raise SpecError(path, where, f"the schema has no column with role '{role}'")
    stray = [c for c in exclude if c not in names]
    if stray:
        raise SpecError(path, f"{where}.exclude", f"'{stray[0]}' is not a column of role {role} ({names})")
    kept = [c for c in names if c not in exclude]
    if not kept:
        raise SpecError(path, f"{where}.exclude", f"excludes every column of role {role}")
    return kept


class Pipeline:
    """An ordered list of ops over a schema, after optional reshaping stages (``stages``). Build with
    ``Pipeline.from_file`` or ``Pipeline.load``."""

    def __init__(self, doc: dict[str, Any], schema: Schema, path: str = "<memory>", xp: Backend = cpu, *, op_directory: Path | None = None):
        """``op_directory``: where the modules of user ops (``MODULE:CLASS``) are looked for after the Python path
        (``etl.ops.user``): the directory of the pipeline file, for ``from_file``."""
        if doc.get("split") is not None:  # dates YAML read from unquoted text kept as ISO text, as the artifacts' JSON holds them
            doc = {**doc, "split": canonical(doc["split"])}
        self.doc, self.schema, self.path, self.xp = doc, schema, path, xp
        self.op_directory = op_directory
        self.name = str(doc.get("name", schema.name))
        self.stages: list[Stage] = parse_stages(doc.get("stages"), schema, path)
        #: which rows ``etl preprocess`` writes as train, valid and test rows (None: no split)
        self.split_spec: Split | None = parse_split(doc.get("split"), schema, path)
        self.ops: list[Op] = []
        #: the Groupby that ends the ops (None: the output has a row per event)
        self.groupby: Groupby | None = None
        raw_ops = doc.get("ops")
        if not isinstance(raw_ops, list) or not raw_ops:
            raise SpecError(path, "ops", "expected a non-empty list of ops")
        specs = {c.name: c for c in schema.columns}
        created: dict[str, ColumnSpec] = {}
        for i, raw in enumerate(raw_ops):
            where = f"ops[{i}]"
            if not isinstance(raw, dict) or "op" not in raw:
                raise SpecError(path, where, "expected a mapping with an 'op' key")
            if raw["op"] == Groupby.name:
                if i != len(raw_ops) - 1:
                    problem = "Groupby must be the last op: the ops run on the events, before it makes one row per group"
                    raise SpecError(path, f"{where} (Groupby)", problem)
                self.groupby = Groupby.parse({k: v for k, v in raw.items() if k != "op"}, path, f"{where} (Groupby)")
                continue
            try:
                cls = op_class(raw["op"], [Groupby.name], op_directory)
            except ValueError as e:
                raise SpecError(path, f"{where}.op", str(e)) from None
            where = f"{where} ({raw['op']})"
            params = {k: v for k, v in raw.items() if k not in ("op", "columns")}
            wrong = check_parameters(cls, params)
            if wrong is not None:
                raise SpecError(path, f"{where}.{wrong[0]}", wrong[1])
            try:
                selector = raw["columns"] if "columns" in raw else cls.implied_columns(params)
            except ValueError as e:
                raise SpecError(path, where, str(e)) from None
            if selector is None:
                raise SpecError(path, f"{where}.columns", "missing")
            if cls.crosses:
                columns = _resolve_crosses(selector, schema, created, path, f"{where}.columns")
            else:
                columns = _resolve(selector, schema, created, path, f"{where}.columns")
            try:
                op = cls(columns, **params)
                op.bind(specs | created)
            except TypeError as e:
                raise SpecError(path, where, f"bad parameters: {e} (see {PIPELINE_DOCS})") from None
            except ValueError as e:
                raise SpecError(path, where, str(e)) from None
            created |= {c: spec for c, spec in op.new_columns().items() if c not in specs}
            self.ops.append(op)
        self.created = created
        #: the columns the ops leave, in output order; the output's columns (those of Groupby, when there is one)
        self.event_columns = self._check_flow()
        self.output_columns = self.event_columns
        if self.groupby is not None:
            try:
                self.groupby.bind(schema, self.kinds_after(self.ops), self._is_list, self.event_columns)
            except ValueError as e:
                raise SpecError(path, f"ops[{len(raw_ops) - 1}] (Groupby)", str(e)) from None
            self.output_columns = self.groupby.outputs
            if self.split_spec is not None:
                raise SpecError(path, "split", "a pipeline that ends with Groupby takes no split: a group's events would fall in several splits")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: str | Path, xp: Backend = cpu) -> Pipeline:
        """Read a pipeline file (YAML): ``path``, or the name of a pipeline that ships with etl (``"criteo_hash"``).
        Its ``schema`` is a path relative to the file or a shipped schema's name (``etl.resources.resolve_schema_of``:
        a relative path that is gone falls back to the shipped schema of its file name)."""
        p = resolve("pipelines", path)
        doc = read_yaml(p)
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise SpecError(str(p), "schema", "expected the path of a schema file, or a shipped schema's name")
        try:
            schema_file = resolve_schema_of(p, doc["schema"])
        except ConfigError as e:
            raise SpecError(str(p), "schema", str(e)) from None
        schema = load_schema(schema_file)
        return cls(doc, schema, str(p), xp, op_directory=p.parent.resolve())

    @classmethod
    def load(cls, directory: str | Location, xp: Backend = cpu) -> Pipeline:
        """Rebuild a fitted pipeline from artifacts written by ``save`` (JSON + Parquet only). Its document keeps
        the split it was fitted with, if any; ``split_spec`` is None: a fitted pipeline has no split left to run."""
        return artifacts.load(directory, xp, cls)

    def with_stages(self, stages: list[Stage]) -> Pipeline:
        """A copy of this pipeline whose row-scope stages are ``stages``; it shares the ops (fitting one fits the
        other)."""
        staged = copy.copy(self)
        staged.stages = list(stages)
        return staged

    def _check_flow(self) -> list[str]:
        """Follow each column's kind (raw → keys → ids; numbers) through the ops; return the output columns."""
        kind = _schema_kinds(self.schema)
        order = list(kind)
        written: set[str] = set()
        categorical = [c.name for c in self.schema.columns if c.role in ("categorical", "list")]
        for i, op in enumerate(self.ops):
            for c in op.source_columns():
                if c not in self.schema.names:
                    raise SpecError(self.path, f"ops[{i}] ({op.name})", f"no schema column named '{c}'{self._unknown(c, self.schema.names)}")
            where = f"ops[{i}] ({op.name}).columns"
            for c in op.columns:
                if c not in kind:
                    raise SpecError(self.path, where, f"no column named '{c}'{self._unknown(c, list(kind))}")
                if kind[c] == "passthrough":
                    raise SpecError(self.path, where, f"column '{c}' is a passthrough column: copied to the output unchanged, never an op input")
                if op.reads == "source":
                    if c in written:
                        problem = f"column '{c}' is written by an earlier op; {op.name} reads it as the schema declares it (put {op.name} first)"
                        raise SpecError(self.path, where, problem)
                elif op.reads is not None and kind[c] not in _kinds(op.reads) and not (kind[c] == op.keeps and c not in self.schema.names):
                    hint = " (put a Decode op before it)" if kind[c] == "raw" else ""
                    raise SpecError(self.path, where, f"column '{c}' holds {kind[c]} values, the op needs {' or '.join(_kinds(op.reads))}{hint}")
            overwritten = [c for c in op.outputs if kind.get(c) == "passthrough"]
            if overwritten:
                raise SpecError(self.path, f"ops[{i}] ({op.name})", f"writes column '{overwritten[0]}', a passthrough column")
            for c in op.outputs:
                if c not in op.columns and c in kind:
                    raise SpecError(self.path, f"ops[{i}] ({op.name})", f"creates column '{c}', which already exists")
            order.extend(c for c in op.outputs if c not in kind)
            categorical.extend(c for c, spec in op.new_columns().items() if spec.role == "categorical")
            written.update(op.outputs)
            op.bind_kinds({c: kind[c] for c in op.columns})
            _follow(kind, op)
        for c in categorical if self.groupby is None else []:  # Groupby checks the columns it writes
            if kind[c] != "ids":
                problem = f"categorical column '{c}' is not turned into ids (add Decode, then Hash or Categorify)"
                raise SpecError(self.path, "ops", problem)
        return order

    def _unknown(self, c: str, known: list[str]) -> str:
        """What to add to "no column named c": the schema drops it, or the nearest of the ``known`` columns, and
        the columns there are (the first 50)."""
        if c in self.schema.text_names:
            return " (the schema drops it: role drop)"
        shown = ", ".join(known[:50]) + (f", ... ({len(known)} in all)" if len(known) > 50 else "")
        return f"{did_you_mean(c, known)} (columns: {shown})"

    @property
    def passthrough(self) -> list[str]:
        """The passthrough columns: in the output as they were read, never transformed (with a Groupby, also its
        aggregates that keep a passthrough column's values: ``Groupby.passthrough``)."""
        named = self.schema.by_role("passthrough")
        return named if self.groupby is None else named + [c for c in self.groupby.passthrough if c not in named]

    @property
    def training_differs(self) -> bool:
        """Whether ``transform(..., training=True)`` can give other values than a plain transform (an op overrides
        ``Op.transform_training``: TargetEncode)."""
        return any(type(op).transform_training is not Op.transform_training for op in self.ops)

    @property
    def input_columns(self) -> list[str]:
        """The raw columns the transform reads (every schema column but the passthrough ones), in schema order."""
        return [c for c in self.schema.names if c not in self.passthrough]

    # ------------------------------------------------------------------ fit and artifacts
    @property
    def is_fitted(self) -> bool:
        return all(op.is_fitted for op in self.ops)

    @property
    def fit_warnings(self) -> list[str]:
        """What the fit found doubtful about the fitted state, one line each in op order (``Op.fit_warnings``: a
        column whose normalized values collapse...); kept in the artifacts, so a loaded pipeline has them too."""
        return [w for op in self.ops for w in op.fit_warnings()]

    def fit(
        self,
        shards: list[Location],
        workers: int = 1,
        on_error: OnError = "raise",
        progress: Progress | None = None,
        client: Client | None = None,
        partitions: int | None = None,
        workdir: str | Location | None = None,
    ) -> None:
        """Fit every fittable op, streaming over ``shards`` row group by row group in bounded memory with ``workers``
        threads, or on the workers of the Dask ``client`` (see ``etl.pipeline.fit``: ``partitions`` and
        ``workdir`` are for a cluster). The fitted state does not depend on shard order, worker count, executor
        or partitions. Invalid rows raise ``RowError`` or, with ``on_error="quarantine"``, are left out;
        ``progress`` (``etl.runtime.progress``) is called with the name of the fitting pass and numbers of rows read.

        A pipeline with a ``split`` is fitted on its train rows by ``etl preprocess`` (``etl.preprocess.preprocess``),
        which resolves the split first: fitting it here on every row raises ``ConfigError``."""
        if self.split_spec is not None and not any(isinstance(s, SplitStage) for s in self.stages):
            raise ConfigError(f"{self.path} has a split: etl preprocess fits its statistics on the train rows only and writes each split "
                              "(fitting it on every row would let the valid and test rows into them)")  # fmt: skip
        fit_shards(self, shards, workers, on_error, progress, client, partitions, workdir)

    def save(self, directory: str | Location) -> None:
        """Write the fitted state to ``directory`` (see ``etl.pipeline.artifacts``)."""
        artifacts.save(self, directory)

    def cardinalities(self) -> dict[str, int]:
        """Embedding table size of every id column (with a Groupby: of its output's)."""
        events = self._event_cardinalities()
        return events if self.groupby is None else self.groupby.cardinalities(events)

    def _event_cardinalities(self) -> dict[str, int]:
        """Embedding table size of every id column the ops leave."""
        out: dict[str, int] = {}
        for op in self.ops:
            out.update(op.cardinalities_given(out))
        return out

    # ------------------------------------------------------------------ host / device parts
    def split(self) -> tuple[list[Op], list[Op]]:
        """The ops as (host part, device part), for transforming after the host→device copy. The host part is
        every op that reads raw values (decoding text needs the variable-length bytes, which stay on the host) or
        the columns as the schema declares them (DateParts); the device part is the rest (dense ops, Hash,
        Categorify, crosses, ops on decoded lists), each part in pipeline order. The host part then the device
        part gives the same result as every op in order: an op of the host part never reads a column that an
        earlier op of the device part writes."""
        kind = _schema_kinds(self.schema)
        host: list[Op] = []
        device: list[Op] = []
        for op in self.ops:
            on_raw = op.reads in ("raw", "source") or (op.reads is None and all(kind.get(c) == "raw" for c in op.columns))
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

    # ------------------------------------------------------------------ transform
    def transform(
        self, batch: Batch, on_error: OnError = "raise", part: Part = "all", xp: Backend | None = None, *, training: bool = False
    ) -> Transformed:
        """Run every op (the pipeline must be fitted). Invalid rows raise ``RowError`` or, with
        ``on_error="quarantine"``, are left out and listed in ``Transformed.rejected``.

        ``training``: the rows are training rows, those the pipeline was fitted on: an op whose statistics hold each
        such row's own target gives it values without it (``Op.transform_training``: TargetEncode's out-of-fold
        encodings). False (the default): every other row (validation, test, serving) gets the values of the full
        statistics. It changes nothing for a pipeline without such an op.

        ``part`` picks the ops of ``split``: ``"host"`` (label check + host part), ``"device"`` (device part +
        output check) or ``"all"``; ``xp`` is the backend (default: the pipeline's). Quarantine takes rows out
        of numpy batches: it needs the CPU backend."""
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        if self.groupby is not None:
            raise ConfigError(f"{self.path} ends with Groupby, which makes one row per group of events: `etl preprocess` brings each group's "
                              "events together; a transform of one batch at a time (Pipeline.transform, serving, the Loader on raw shards, "
                              "--follow) cannot. Run etl preprocess, then load its output")  # fmt: skip
        if not self.is_fitted:
            raise ArtifactError("the pipeline is not fitted: run fit first or load fitted artifacts")
        host, device = self.split()
        ops = {"all": self.ops, "host": host, "device": device}[part]
        return self.run_ops(batch, ops, on_error, xp, labels=part != "device", output=part != "host", training=training)

    def run_ops(
        self, batch: Batch, ops: list[Op], on_error: OnError, xp: Backend | None = None, *, labels: bool, output: bool,
        training: bool = False,
    ) -> Transformed:  # fmt: skip
        """Run on ``batch``: the label check (when ``labels``), then ``ops`` in the given order (``training``: as
        ``transform`` says, each op's ``transform_training``), then the output check (when ``output``), with backend
        ``xp`` (default: the pipeline's). Invalid rows are handled as by ``transform``, which checks its arguments
        and that the pipeline is fitted; this does not (fitting runs the fitted ops that feed the ops it fits)."""
        xp = xp or self.xp
        t = Transformed(batch)
        if labels:
            _apply("label check", t, on_error, partial(self.check_labels, xp=xp), xp)
        for op in ops:
            _apply(op.name, t, on_error, partial(op.transform_training if training else op.transform, xp=xp), xp)
        if output:
            _apply("output check", t, on_error, partial(self.check_output, xp=xp), xp)
        return t

    def check_labels(self, batch: Batch, xp: Backend | None = None) -> None:
        """Raise ``InvalidRows`` for the rows without a usable label (missing, NaN or infinite), those an op's
        source columns refuse (``Op.check_sources``: History's rows without a usable key or time, no events) and,
        with a Groupby, those missing a ``by`` value (no event of any group); checked before any op, so fit and
        transform skip the same rows. ``xp``: the backend (default: the pipeline's)."""
        for c in self.schema.by_role("label"):
            col = batch.columns.get(c)
            if col is None:
                continue
            if col.valid is not None and col.null_count():
                raise InvalidRows(c, ~col.valid, "label is missing")
            bad = (xp or self.xp).nonfinite_mask(col.values, None)
            if bad is not None:
                raise InvalidRows(c, bad, "label is NaN or infinite")
        for op in self.ops:
            op.check_sources(batch, xp or self.xp)
        for c in self.groupby.by if self.groupby is not None else []:
            key = batch.columns.get(c)
            if key is not None and key.valid is not None and key.null_count():
                raise InvalidRows(c, ~key.valid, "the group key is missing")

    def check_output(self, batch: Batch, xp: Backend | None = None) -> None:
        """Raise ``InvalidRows`` for the rows of a transformed batch holding, in an output column (the first such
        column; passthrough columns aside: they are not transformed), a NaN or infinite value, or a finite value beyond
        the float32 range the output holds it in. Output columns the batch does not hold (a label left out at serving
        time) are not checked. ``xp``: the backend (default: the pipeline's)."""
        xp = xp or self.xp
        skip = set(self.passthrough)
        checked = self.output_columns if self.groupby is None else [c for c in self.event_columns if c in self.groupby.value_columns]
        names = [c for c in checked if c not in skip and c in batch.columns and not isinstance(batch[c].values, Strings)]
        found = xp.first_nonfinite([(xp.as_float32(batch[c].values), batch[c].valid) for c in names])
        if found is None:
            return
        col = batch[names[found[0]]]
        nonfinite = xp.nonfinite_mask(col.values, col.valid)
        if nonfinite is not None:
            raise InvalidRows(names[found[0]], nonfinite, "value is NaN or infinite after the transform")
        raise InvalidRows(names[found[0]], found[1], "value overflows float32 after the transform")

    def transform_table(self, data: Any) -> pa.Table:
        """Transform raw rows held in memory (the serving path) into a pyarrow Table typed by ``output_schema``.

        ``data``: a pyarrow Table, a pandas or polars DataFrame, or a dict of column name → list of values, holding
        the schema's columns (others are ignored). ``None`` is a missing value in any column, also in a column
        of only ``None`` (see ``etl.io.memory``). Every row given has its output row: the reshaping stages
        (``stages``) are not run here, only the ops. The label may be left out: the output then has no label
        column (a label that is given must be valid, as in training). Invalid values raise ``RowError`` naming
        the row within ``data`` (source ``<table>``); a missing or unreadable column raises ``InputError``."""
        table = arrow_table(data, self.schema)
        absent = [c for c in self.schema.by_role("label") if c not in table.column_names]
        needed = [c for c in absent if any(c in op.columns for op in self.ops)]
        if needed:
            raise InputError(SOURCE, "column missing (an op of the pipeline reads it)", column=needed[0])
        columns = [c for c in self.schema.names if c not in absent]
        batch = self.transform(batch_from_arrow(table, self.schema, SOURCE, columns=columns)).batch
        schema = self.output_schema()
        for c in absent:
            schema = schema.remove(schema.get_field_index(c))
        return self.to_arrow(batch, schema)

    # ------------------------------------------------------------------ output
    def output_schema(self) -> pa.Schema:
        """Arrow schema of the output: float32 label/dense, int32/int64 ids by cardinality, list<id> lists,
        passthrough columns in their raw-layout type (nullable); with a Groupby, its columns
        (``Groupby.output_schema``)."""
        cards = self._event_cardinalities()
        raw = raw_arrow_schema(self.schema)
        if self.groupby is not None:
            return self.groupby.output_schema(partial(self._field, cards=cards, raw=raw))
        return pa.schema([self._field(c, cards, raw) for c in self.output_columns])

    def event_field(self, c: str) -> pa.Field:
        """The output field of the event column ``c`` (one the ops leave), as a pipeline without Groupby writes it."""
        return self._field(c, self._event_cardinalities(), raw_arrow_schema(self.schema))

    def _field(self, c: str, cards: dict[str, int], raw: pa.Schema) -> pa.Field:
        """The output field of the event column ``c`` (``cards``: the id columns' cardinalities; ``raw``: the
        schema's raw-layout types)."""
        if c in self.schema.by_role("passthrough"):
            return raw.field(c)
        if c in cards:
            t = pa.from_numpy_dtype(id_dtype(cards[c]))
            return pa.field(c, pa.list_(t) if self._is_list(c) else t, nullable=False)
        if self._is_list(c):  # a list of numbers (float32) or of int64 passthrough values: History's of such a column
            return pa.field(c, pa.list_(pa.int64() if self.created[c].dtype == "int64" else pa.float32()), nullable=False)
        return pa.field(c, pa.float32())

    def _is_list(self, c: str) -> bool:
        spec = self.created.get(c) if c not in self.schema.names else self.schema.column(c)
        return spec is not None and spec.is_list

    def to_arrow(self, batch: Batch, schema: pa.Schema | None = None) -> pa.Table:
        """The output table of a transformed batch, typed by ``output_schema`` (or by ``schema``, some of its
        fields)."""
        schema = schema or self.output_schema()
        arrays = []
        for f in schema:
            col = batch[f.name]
            if f.name in self.passthrough:
                arrays.append(_raw_array(col, f.type))
            elif col.is_list:
                values = from_numpy(col.array, f.type.value_type, col.valid)
                arrays.append(pa.ListArray.from_arrays(from_numpy(col.list_offsets, pa.int32()), values, type=f.type))
            else:
                arrays.append(from_numpy(col.array, f.type, col.valid))
        return pa.Table.from_arrays(arrays, schema=schema)


def _raw_array(col: Column, t: pa.DataType) -> pa.Array:
    """A column as read from the raw layout (numbers, or text) → an Arrow array of its raw type ``t``."""
    if not isinstance(col.values, Strings):
        return from_numpy(col.array, valid=col.valid).cast(t)
    text = col.values.take(np.arange(len(col.values)))  # contiguous: string i ends where string i + 1 starts
    offsets = np.append(text.starts, text.ends[-1:]).astype(np.int64) if len(text) else np.zeros(1, np.int64)
    buffers = [validity(col.valid), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text.data))]
    return pa.Array.from_buffers(pa.large_string(), len(text), buffers).cast(t)


def _schema_kinds(schema: Schema) -> dict[str, str]:
    """The kind of each schema column before any op: label and dense columns hold numbers, passthrough columns are
    "passthrough" (no op reads them), the others raw values."""
    kinds = {"label": "number", "dense": "number", "passthrough": "passthrough"}
    return {c.name: kinds.get(c.role, "raw") for c in schema.columns}


def _kinds(reads: str | tuple[str, ...]) -> tuple[str, ...]:
    """The kinds an op's ``reads`` accepts."""
    return reads if isinstance(reads, tuple) else (reads,)


def _follow(kind: dict[str, str], op: Op) -> None:
    """Update ``kind`` with the columns ``op`` writes (in place: what it reads, unchanged when ``writes`` is None)."""
    for c in op.outputs:
        kind[c] = op.writes or kind.get(c, "raw")


def _apply(name: str, t: Transformed, on_error: OnError, step: Step, xp: Backend) -> None:
    """Run one step (an op, or a check) with backend ``xp``; on invalid rows raise ``RowError`` or move the
    rows to ``t.rejected`` and run the step again on the rest."""
    while True:
        try:
            t.batch = t.batch.with_columns(step(t.batch) or {})
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


def _row_error(batch: Batch, column: str, reason: str, mask: np.ndarray, xp: Backend) -> RowError:
    """The error for the first row of ``mask`` (its value shown as read back to the host)."""
    i = int(np.flatnonzero(mask)[0])
    col = batch[column]
    col = Column(*(None if a is None else xp.to_numpy(a) for a in (col.values, col.valid, col.offsets))).take(np.array([i]))
    value = col.values.to_list() if isinstance(col.values, Strings) else col.values.tolist()
    shown = value if col.is_list else value[0]
    return RowError(batch.source, batch.row_group, int(batch.row_ids[i]), column, f"{reason}: {shown!r}")
