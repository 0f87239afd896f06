"""A pipeline's transform of a row group a few columns at a time, when every op allows it.

A pipeline whose ops are all ``columnwise`` (``etl.ops.Op.columnwise``: each output column is computed in place
from the same input column alone, with fitted state the transform never changes), with no reshaping stage and no
Groupby, gives every column the same values whether its row group is transformed whole or column by column. Its
schema columns are then cut into groups of ``GROUP_COLUMNS`` (schema order); each group is read, checked (label
check, output check) and transformed by the ops restricted to its columns (``Op.on_columns``) before the next is
read, so a worker holds one group's rows as read and the output of the groups before it, never a whole row group
as read with its intermediate arrays.

The fit that stashes what it reads (``etl.pipeline.single_pass``) reads the columns it keeps the same way, through
the ops it runs first (Decode), and transforms a stashed row group with the ops left a group at a time. A row that a
check or an op finds invalid makes the caller transform its row group whole again (``etl.preprocess.shard
.transform_read``, ``single_pass``): the error raised, or the rows quarantined with the first reason in pipeline
order, are then exactly those of a whole-row-group transform.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from etl.batch import Column
from etl.io.parquet import Shard
from etl.ops import Op
from etl.pipeline.core import Pipeline, Transformed

#: the schema columns a group holds (the last group may hold fewer). Fewer columns a group hold less memory and cost
#: more reads: on Criteo-like shards (40 columns, 131,072-row row groups, 2 workers, 8 M rows), groups of 8, 10, 14
#: and 20 columns peaked at ~400, ~410, ~430 and ~490 MiB (Hash) against ~570 whole, for 4-8 % more wall time and
#: 1-4 % more CPU time than whole row groups (within the noise of 2 M rows)
GROUP_COLUMNS = 10


@dataclass(frozen=True)
class ColumnGroup:
    """Schema columns read together (``columns``, schema order), and the pipeline's ops on those of them they
    transform (``ops``, pipeline order); the group's output columns are the output columns among ``columns``."""

    columns: tuple[str, ...]
    ops: tuple[Op, ...]


def column_groups(
    pipeline: Pipeline, size: int = GROUP_COLUMNS, *, ops: list[Op] | None = None, columns: list[str] | None = None
) -> list[ColumnGroup] | None:
    """The groups of ``size`` of the schema columns ``columns`` (default: all of them) that ``ops`` (default: every
    op of ``pipeline``, fitted) transform one group after the other, or None when their row groups must be
    transformed whole: an op that is not columnwise, an op on a column that is not one of ``columns`` (one an earlier
    op created), a reshaping stage, a Groupby, or so few columns that a single group holds them all."""
    if size < 1:
        raise ValueError(f"column_groups: size must be >= 1, got {size}")
    ops = pipeline.ops if ops is None else ops
    if pipeline.stages or pipeline.groupby is not None or not all(op.columnwise for op in ops):
        return None
    names = [c for c in pipeline.schema.names if columns is None or c in columns]
    if len(names) <= size or any(c not in names for op in ops for c in op.columns):
        return None  # one group, or an op on a column an earlier op made (a DateParts part): kept whole
    groups = []
    for k in range(0, len(names), size):
        chunk = names[k : k + size]
        groups.append(ColumnGroup(tuple(chunk), tuple(op.on_columns(chunk) for op in ops if any(c in chunk for c in op.columns))))
    return groups


def read_by_groups(pipeline: Pipeline, groups: list[ColumnGroup], shard: Shard, i: int, *, output: bool, training: bool = False) -> Transformed:
    """Row group ``i`` of ``shard`` read and transformed a group at a time: each group's columns read, the label
    check and the group's ops run (then the output check when ``output``; ``training`` as ``Pipeline.transform``
    says) before the next group is read. The batch holds every group's columns as the ops left them. ``RowError``
    for the first invalid row a group finds."""
    columns: dict[str, Column] = {}
    for g in groups:
        t = pipeline.run_ops(shard.read(i, list(g.columns)), list(g.ops), "raise", labels=True, output=output, training=training)
        columns.update((c, t.batch[c]) for c in g.columns)
        batch = t.batch
        del t  # the group's columns as read go before the next group is read
    return Transformed(replace(batch, columns=columns))
