"""Reshaping stages: steps that may change the row count. Those of row scope run on raw rows before the fit and
the ops; the one of key scope, Groupby, after the ops (see Scopes).

A pipeline file lists the row-scope ones under ``stages``, before ``ops``, and writes Groupby as the last op::

    stages:
      - {stage: Filter, where: {column: label, op: not_null}}
    ops:
      - ...
      - {op: Groupby, by: [session_id], sort_by: [timestamp], aggs: {item_id: [list]}, max_len: 20}

Ops keep every row (a row leaves only through the quarantine, with its reason); stages are where rows may be
removed, or regrouped. The contract:

- A row-scope stage reads raw columns: the schema's columns as decoded from Parquet (``columns`` names those it
  reads), before any op. Stages run in the order listed, each on what the one before passed on.
- Everything downstream sees the stages' output: the fit (vocabularies and statistics are fitted on the rows the
  stages keep: ``etl fit``, ``Pipeline.fit``, ``etl preprocess`` in threads, in its single pass and on a Dask
  cluster), the label check, the ops and the quarantine. A row a stage removes is never quarantined; a row it
  keeps keeps its row number in the source file, so errors and quarantine files name the source row.
- Row accounting: per output file, ``etl preprocess`` records each stage's rows in and out (``StageRows`` in the
  manifest, ``etl.io.processed``), so that ``rows_in = rows_out + rows_quarantined + rows removed by stages``
  holds, and is checked, per file and in total.
- Stages are not run by the ``Loader`` on raw shards (it refuses a pipeline that has them: run ``etl preprocess``,
  then load its output, which the loader reads like any other) nor by ``Pipeline.transform`` and
  ``transform_table``, which transform the rows they are given (the serving path keeps one output row per request).

Scopes (``scope``):

- ``"rows"``: shard-local. The stage sees one row group at a time (``select(table, rows, at)``: the row group as
  read, the positions of the rows reaching the stage and where the row group lies, ``RowGroupAt``; it returns the
  positions of the rows it passes on, in the order it passes them) and needs nothing from other row groups or
  shards: ``Filter`` reads the values only, the split's stage (``etl.pipeline.split_rows``) the position too. Such stages run wherever a row group is
  read (threads, Dask tasks, the single pass's stash, a rerun, ``--follow``), with no step of their own.
  ``Filter`` (``etl.pipeline.filter``) is one.
- ``"key"``: keyed, for stages that need every row of a key at once: ``Groupby`` (``etl.pipeline.groupby``: one
  row per group of events, a session's or a user's lists). Such a stage cannot run per row group: its plan is an
  exchange before it (``etl.pipeline.exchange``, driven by ``etl.preprocess.keyed``, the exchange History runs on
  too). Each row group's rows (after the row-scope stages) are spilled with a hash of the key and their input
  position (shard index in input order, row number in the file); the hash buckets are cut into partitions by the
  bytes of their rows (at most 16 MiB each, or a quarter of ``--memory-budget`` when less, whatever the shards or workers); each
  partition is read whole and sorted by (key hash, key values, order columns, input position), so a key's rows are
  together and in order, and results depend neither on shard cuts nor on worker count. A key-scope stage needs
  the events' transformed values (ids from vocabularies fitted on the events), so it is written as the last entry
  of ``ops``, not under ``stages`` (``parse_stages`` says so): the fit sees the events, and the stage runs after the
  ops, over each sorted partition; output file ``p`` holds partition ``p``'s rows. The manifest records it as one
  more stage: the events it took in (``rows_in``), the rows it passed on (``rows_out``: the groups written, plus
  the events quarantined within it by the label check and the ops), and ``groups_dropped`` (by ``min_len``), so
  that the accounting above holds. ``etl preprocess`` runs it in threads (``--cluster`` is refused, as for
  History); the loader, ``Pipeline.transform`` and ``transform_table`` refuse it. ``parse_stages`` accepts only
  stages in ``REGISTRY``, and ``run_stages`` only row-scope ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from etl.batch import Batch
from etl.errors import SpecError
from etl.io.parquet import Shard, batch_from_arrow
from etl.io.processed import StageRows, sum_stages
from etl.pipeline.filter import Filter
from etl.schema import Schema

#: Where stages and their parameters are documented (named in errors about unknown stages).
STAGE_DOCS = "pipelines/README.md#stages"


@dataclass(frozen=True)
class RowGroupAt:
    """Where a row group lies: row group ``row_group`` of the shard ``source`` (its path as the run names it),
    starting at row ``first_row`` of the file."""

    source: str
    row_group: int
    first_row: int


class Stage(Protocol):
    """A reshaping stage (see the module docstring): its ``name`` in pipeline files, its ``scope`` ("rows" or
    "key") and the raw ``columns`` it reads."""

    name: ClassVar[str]
    scope: ClassVar[str]
    columns: list[str]

    def select(self, table: pa.Table, rows: np.ndarray, at: RowGroupAt | None = None) -> np.ndarray:
        """The positions (in ``table``) of the rows passed on, from ``rows``: the positions of the rows reaching
        the stage, in order (int64). ``at``: where ``table`` lies (None for rows that lie in no file)."""
        ...


#: The stages a pipeline file may name; each class has ``parse(params, schema, path, where)``.
REGISTRY: dict[str, Any] = {"Filter": Filter}


def parse_stages(doc: Any, schema: Schema, path: str) -> list[Stage]:
    """The stages of a pipeline document's ``stages`` field (``doc``; None when the field is absent: no stages),
    checked against ``schema``. ``SpecError`` naming ``path`` and the field for anything but a list of mappings
    with a known ``stage`` and its parameters."""
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise SpecError(path, "stages", f"expected a list of stages, got {doc!r}")
    stages = []
    for i, raw in enumerate(doc):
        where = f"stages[{i}]"
        if not isinstance(raw, dict) or "stage" not in raw:
            raise SpecError(path, where, "expected a mapping with a 'stage' key")
        cls = REGISTRY.get(raw["stage"])
        if raw["stage"] == "Groupby":
            raise SpecError(path, f"{where}.stage", "Groupby groups the events the ops transform: write it as the last entry of ops "
                            f"(see {STAGE_DOCS})")  # fmt: skip
        if cls is None:
            raise SpecError(path, f"{where}.stage", f"unknown stage {raw['stage']!r}; known: {sorted(REGISTRY)} (see {STAGE_DOCS})")
        stages.append(cls.parse({k: v for k, v in raw.items() if k != "stage"}, schema, path, f"{where} ({raw['stage']})"))
    return stages


def run_stages(stages: list[Stage], table: pa.Table, at: RowGroupAt | None = None) -> tuple[np.ndarray, tuple[StageRows, ...]]:
    """Run the row-scope ``stages`` on a row group as read (``table``, lying ``at``): the positions of the rows
    they pass on, in order, and each stage's rows in and out."""
    rows = np.arange(table.num_rows, dtype=np.int64)
    counts = []
    for stage in stages:
        if stage.scope != "rows":
            raise ValueError(f"stage {stage.name} has scope {stage.scope!r}: it needs an exchange by key, not a row group")
        kept = stage.select(table, rows, at)
        counts.append(StageRows(stage.name, len(rows), len(kept)))
        rows = kept
    return rows, tuple(counts)


def staged_batch(
    stages: list[Stage], schema: Schema, table: pa.Table, source: str, row_group: int, first_row: int, columns: list[str] | None = None
) -> tuple[Batch, tuple[StageRows, ...]]:
    """The batch the ops read from a row group as read (``table``, row ``first_row`` of ``source`` onwards; its
    columns ``columns``, default every schema column), and each stage's rows in and out: the rows ``stages`` pass
    on, with their row numbers in the source. Without stages: ``batch_from_arrow``'s batch, and no counts."""
    batch = batch_from_arrow(table, schema, source, row_group, first_row, columns)
    if not stages:
        return batch, ()
    rows, counts = run_stages(stages, table, RowGroupAt(source, row_group, first_row))
    if len(rows) != table.num_rows or not np.array_equal(rows, np.arange(table.num_rows)):
        batch = batch.take(rows)
    return batch, counts


def read_staged(stages: list[Stage], shard: Shard, i: int, columns: list[str] | None = None) -> tuple[Batch, tuple[StageRows, ...]]:
    """Row group ``i`` of ``shard`` as ``staged_batch`` gives it (``columns`` read, and those the stages read)."""
    if not stages:
        return shard.read(i, columns), ()
    names = shard.schema.names
    read = None if columns is None else [c for c in names if c in columns or any(c in s.columns for s in stages)]
    return staged_batch(stages, shard.schema, shard.read_table(i, read), str(shard.path), i, shard.row_group_starts[i], columns)


def stage_totals(stages: list[Stage], per_batch: list[tuple[StageRows, ...]]) -> tuple[StageRows, ...] | None:
    """The rows in and out of each of ``stages`` summed over batches (``per_batch``: each batch's counts, as
    ``staged_batch`` gives them; a shard without rows has none); None when there are no stages. ValueError when a
    batch's counts are not those of ``stages``."""
    if not stages:
        return None
    return sum_stages([tuple(StageRows(s.name, 0, 0) for s in stages), *per_batch])
