"""A small side table left-joined onto every input row while converting text (``etl convert --join FILE --on KEY``).

The side table (e.g. MovieLens ``movies.csv``) is delimited text read with the schema's text conventions
(delimiter, null value; it must have a header line, whatever ``text.header`` says for the inputs) and held in
memory. The schema describes the joined rows: the schema columns named in the side table's header (other than
``KEY``) come from the side table, all others from the inputs; side-table columns the schema does not name (e.g.
``title``) are not read. Each side column is parsed with its schema type (list columns split at their separator), so
a bad value is reported with the side table's line.

Join semantics: for every input row, in input order, the side row whose ``KEY`` equals the input's ``KEY`` (same
type, exact value) supplies the side columns; an input row whose key is missing or not in the side table gets
missing values there. Input rows are never dropped or repeated: the side table's keys must be unique and present
(``InputError`` naming the line otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import ConfigError, InputError
from etl.io.fs import Location
from etl.io.text import header_names, raw_arrow_schema, read_text
from etl.schema import Schema

__all__ = ["SideTable"]


@dataclass(frozen=True)
class SideTable:
    """A side table loaded for joining: ``table`` holds ``key`` then the side columns, in raw-layout types.

    ``input_schema`` is the part of ``schema`` read from the inputs (every column but the side columns)."""

    path: Path
    key: str
    schema: Schema
    input_schema: Schema
    table: pa.Table

    @classmethod
    def read(cls, path: str | Path, key: str, schema: Schema) -> SideTable:
        """Load the side table at ``path`` for joining on ``key`` rows described by ``schema``.

        Raises ``ConfigError`` when ``key`` is not a scalar column of the schema, ``InputError`` when the file is
        missing, lacks a header with ``key`` and at least one other schema column, holds a bad value, a missing key
        or a key twice."""
        path = Path(path)
        if key not in schema.names:
            raise ConfigError(f"--on {key}: the schema {schema.path} has no column '{key}' (it has {schema.names})")
        if schema.column(key).is_list:
            raise ConfigError(f"--on {key}: a list column cannot be a join key")
        if not path.is_file():
            raise InputError(str(path), "no such file" if not path.exists() else "not a regular file")
        text = replace(schema.text, header=True)
        found = set(header_names(path, Schema(schema.name, schema.columns, text, schema.path)) or [])
        side = [c for c in schema.columns if c.name in found and c.name != key]
        if not side:
            problem = f"a side table's header names the key and schema columns to join; it has {sorted(found)}, the schema {schema.names}"
            raise InputError(str(path), problem)
        side_schema = Schema(schema.name, (schema.column(key), *side), text, str(path))
        arrow = raw_arrow_schema(side_schema)
        table = pa.Table.from_batches(list(read_text(path, side_schema, arrow)), arrow).combine_chunks()
        _check_keys(path, key, table.column(key))
        inputs = Schema(schema.name, tuple(c for c in schema.columns if c not in side), schema.text, schema.path)
        return cls(path, key, schema, inputs, table)

    @property
    def columns(self) -> list[str]:
        """The columns the side table supplies, in schema order."""
        return self.table.column_names[1:]

    def check_input(self, path: Location) -> None:
        """Raise ``InputError`` when the input at ``path`` has a header naming a side column too (which of the two
        to keep would be a guess)."""
        if not self.schema.text.header:
            return
        both = [c for c in self.columns if c in (header_names(path, self.input_schema) or [])]
        if both:
            raise InputError(str(path), f"column(s) {both} are both here and in the side table {self.path}: rename one of them", column=both[0])

    def attach(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (raw layout of ``input_schema``) with the side columns joined on, in ``schema`` order."""
        at = pc.index_in(batch.column(self.input_schema.names.index(self.key)), value_set=self.table.column(self.key))
        side = self.table.take(at)
        arrays = [side.column(c.name).combine_chunks() if c.name in side.column_names[1:] else batch.column(c.name)
                  for c in self.schema.columns]  # fmt: skip
        return pa.RecordBatch.from_arrays(arrays, schema=raw_arrow_schema(self.schema))


def _check_keys(path: Path, key: str, keys: pa.ChunkedArray) -> None:
    """Raise ``InputError`` naming the line (1-based, counting the header) of a missing or repeated key."""
    if keys.null_count:
        line = 2 + pc.index(pc.is_null(keys), True).as_py()
        raise InputError(str(path), f"line {line}: the key is missing (a side table needs one on every line)", column=key)
    counts = pc.value_counts(keys)
    twice = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
    if len(twice):
        value = twice[0]
        lines = [2 + i for i, same in enumerate(pc.equal(keys, value).to_pylist()) if same]
        raise InputError(str(path), f"key {value.as_py()!r} appears on lines {lines[0]} and {lines[1]}: the side table's keys must be unique",
                         column=key)  # fmt: skip
