"""A pipeline's transform of a row group a few columns at a time, when every op allows it.

A pipeline whose ops are all ``columnwise`` (``etl.ops.Op.columnwise``: each output column is computed in place
from the same input column alone, with fitted state the transform never changes), with no reshaping stage and no
Groupby, gives every column the same values whether its row group is transformed whole or column by column. Its
schema columns are then cut into groups of ``GROUP_COLUMNS`` (schema order); each group is read, checked (label
check, output check) and transformed by the ops restricted to its columns (``Op.on_columns``) before the next is
read, so a worker holds one group's rows as read and the output of the groups before it, never a whole row group
as read with its intermediate arrays (on Criteo-like shards: a third of the memory of a whole row group).

A row that a check or an op finds invalid makes the caller transform its row group whole again
(``etl.preprocess.shard.transform_read``): the error raised, or the rows quarantined with the first reason in
pipeline order, are then exactly those of a whole-row-group transform.
"""

from __future__ import annotations

from dataclasses import dataclass

from etl.ops import Op
from etl.pipeline.core import Pipeline

#: the schema columns a group holds (the last group may hold fewer): 4 to 8 measured alike in time and memory on
#: Criteo-like shards; one column a group reads measurably slower (each read has its own set-up)
GROUP_COLUMNS = 8


@dataclass(frozen=True)
class ColumnGroup:
    """Schema columns read together (``columns``, schema order), and the pipeline's ops on those of them they
    transform (``ops``, pipeline order); the group's output columns are the output columns among ``columns``."""

    columns: tuple[str, ...]
    ops: tuple[Op, ...]


def column_groups(pipeline: Pipeline, size: int = GROUP_COLUMNS) -> list[ColumnGroup] | None:
    """The groups of ``size`` schema columns ``pipeline`` (fitted) transforms one after the other, or None when
    its row groups must be transformed whole: an op that is not columnwise, a reshaping stage, a Groupby, or so
    few columns that a single group holds them all."""
    if size < 1:
        raise ValueError(f"column_groups: size must be >= 1, got {size}")
    if pipeline.stages or pipeline.groupby is not None or not all(op.columnwise for op in pipeline.ops):
        return None
    names = pipeline.schema.names
    if len(names) <= size:
        return None
    groups = []
    for k in range(0, len(names), size):
        columns = names[k : k + size]
        ops = tuple(op.on_columns(columns) for op in pipeline.ops if any(c in columns for c in op.columns))
        groups.append(ColumnGroup(tuple(columns), ops))
    return groups
