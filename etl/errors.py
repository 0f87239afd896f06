"""Typed errors. Every user-facing error names where the problem is: file, row group/row and column."""

from __future__ import annotations

from difflib import get_close_matches


class EtlError(Exception):
    """Base class of errors caused by the user's input or configuration (the CLI exits 2 on them).

    Errors pickle with their message and fields (the subclasses' own ``__init__`` arguments are not replayed), so
    an error raised in a Dask worker process reaches the client as the same type, naming the same file, row and
    column."""

    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), self.args, self.__dict__)


class SpecError(EtlError, ValueError):
    """A schema or pipeline file is invalid. The message names the file and the offending field."""

    def __init__(self, path: str, field: str, problem: str):
        self.path, self.field, self.problem = path, field, problem
        super().__init__(f"{path}: field '{field}': {problem}")


class YamlError(SpecError):
    """A schema or pipeline file is not a YAML document: the message is one line, ``FILE:LINE:COLUMN: problem``
    (1-based line and column of the place the parser stopped at, ``line`` and ``column``)."""

    def __init__(self, path: str, line: int, column: int, problem: str):
        super().__init__(path, "<file>", problem)
        self.line, self.column = line, column
        self.args = (f"{path}:{line}:{column}: {problem}",)


class InputError(EtlError, ValueError):
    """An input shard cannot be used: missing, not Parquet, truncated, missing column, wrong type.

    ``row_group`` and ``column`` are set when the problem is local to them.
    """

    def __init__(self, path: str, problem: str, *, row_group: int | None = None, column: str | None = None):
        self.path, self.problem, self.row_group, self.column = path, problem, row_group, column
        where = [path]
        if row_group is not None:
            where.append(f"row group {row_group}")
        if column is not None:
            where.append(f"column '{column}'")
        super().__init__(f"{', '.join(where)}: {problem}")


class RowError(EtlError, ValueError):
    """A single value is invalid (malformed hex, NaN/inf dense value, ...).

    ``row`` is the 0-based row index within the file; ``row_group`` the Parquet row group holding it. The
    message shows at most ``SHOWN_CHARS`` characters of ``problem`` (which ends with the offending value) and then
    says how long it is; ``problem`` keeps it whole.
    """

    SHOWN_CHARS = 200

    def __init__(self, path: str, row_group: int, row: int, column: str, problem: str):
        self.path, self.row_group, self.row, self.column, self.problem = path, row_group, row, column, problem
        shown = problem if len(problem) <= self.SHOWN_CHARS else f"{problem[:self.SHOWN_CHARS]}... ({len(problem)} chars)"
        super().__init__(f"{path}, row group {row_group}, row {row}, column '{column}': {shown}")


class ArtifactError(EtlError, ValueError):
    """Fitted artifacts are missing, of another format version, or do not match the pipeline."""


class FitError(EtlError, ValueError):
    """Fitting gives an op no usable state for a column (no values, a mean or standard deviation beyond the float64
    range). The message names the op and the column."""

    def __init__(self, op: str, column: str, problem: str):
        self.op, self.column, self.problem = op, column, problem
        super().__init__(f"{op}: column '{column}': {problem}")


class ConfigError(EtlError, ValueError):
    """An argument or option has a value that cannot work (``batch_size=0``, an unknown mode, a CUDA device
    without CUDA...). The message names the argument."""


def _rebuild(cls: type[EtlError], args: tuple, fields: dict) -> EtlError:
    """An error of class ``cls`` with message arguments ``args`` and attributes ``fields`` (unpickling)."""
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(fields)
    return e


class LoaderError(EtlError):
    """A failure in a loader worker, re-raised in the training process with the piece it was working on."""


class OutputError(EtlError):
    """The output directory cannot be used: another run holds it, or it overlaps an input. The message names
    the directory and the reason."""


class ClusterError(EtlError):
    """Work on a Dask cluster cannot complete: the worker processes holding one of its tasks, or its inputs, died
    (killed, out of memory) more often than the cluster allows, or none was left to run it; or a local cluster
    failed to start. The message names the task's item (a shard, a piece of one), or the cluster."""


def did_you_mean(name: str, known: list[str]) -> str:
    """``"; did you mean 'X'?"`` for the name of ``known`` closest to ``name`` (difflib) when one is close, letter case
    aside, else ``""``: the hint an error about an unknown name ends with."""
    folded = {k.lower(): k for k in reversed(known)}  # the first of names that differ only in case
    close = get_close_matches(name.lower(), list(folded), n=1, cutoff=0.6)
    return f"; did you mean '{folded[close[0]]}'?" if close else ""
