"""The plain DuckDB SQL versions of the two sequence pipelines of the synthetic events, beside the polars ones of
``etl.bench.polars_baselines`` (same outputs; compared to ours by ``etl.bench.sequences``).

DuckDB is no dependency of etl: these run where it is importable (``HAS_DUCKDB``), e.g. from a directory of their
own put on PYTHONPATH (``pip install --target /tmp/duckdb-pkgs duckdb``), and also as a process::

    PYTHONPATH=/tmp/duckdb-pkgs python -m etl.bench.duckdb_baselines history OUT_DIR SHARD [SHARD ...]
    PYTHONPATH=/tmp/duckdb-pkgs python -m etl.bench.duckdb_baselines sessions OUT_DIR SHARD [SHARD ...]

The shards are read in the order given (a row's input position: its shard's place in that order, then its row
number in the file); the output is ``OUT_DIR/part-00000.parquet``. DuckDB uses ``threads`` threads (default 2).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from etl.bench.polars_baselines import CATEGORY, CLICK, FIRST_VOCAB_ID, ITEM, MAX_LEN, MISSING, PRICE, SESSION, TIME, USER, PathLike

try:
    import duckdb
except ImportError:  # these baselines are then unavailable
    duckdb = None
HAS_DUCKDB = duckdb is not None


def _events_sql(files: Sequence[PathLike], ids: Sequence[str]) -> str:
    """``WITH`` clauses ending in ``e``: the events with the columns ``ids`` categorified (``freq_threshold: 1``:
    count descending, key ascending, ids from 3, missing → 1, as ``polars_baselines._polars_ids``) and their input
    position ``pos``."""
    paths = ", ".join(_quoted(f) for f in files)
    rank = "(" + " UNION ALL ".join(f"SELECT {i} AS f, {_quoted(f)} AS name" for i, f in enumerate(files)) + ")"
    clauses = [f"raw AS (SELECT r.*, (rank.f::BIGINT << 40) + r.file_row_number AS pos FROM read_parquet([{paths}], filename=true, "
               f"file_row_number=true) r JOIN {rank} rank ON r.filename = rank.name)"]  # fmt: skip
    for c in ids:
        clauses.append(f"v_{c} AS (SELECT {c} AS k, (row_number() OVER (ORDER BY count(*) DESC, {c}) + {FIRST_VOCAB_ID - 1})::INTEGER AS id "
                       f"FROM raw WHERE {c} IS NOT NULL GROUP BY {c})")  # fmt: skip
    cols = ", ".join(f"coalesce(v_{c}.id, {MISSING})::INTEGER AS {c}" for c in ids)
    joins = " ".join(f"LEFT JOIN v_{c} ON raw.{c} = v_{c}.k" for c in ids)
    clauses.append(f"e AS (SELECT raw.* EXCLUDE ({', '.join(ids)}, filename, file_row_number), {cols} FROM raw {joins})")
    return "WITH " + ",\n".join(clauses)


def duckdb_history(files: Sequence[PathLike], out_dir: PathLike, max_len: int = MAX_LEN, threads: int = 2) -> None:
    """``pipelines/events_sequence.yaml`` in DuckDB SQL, as ``polars_baselines.polars_history`` (same ids, lists
    and dense values).

    The obvious window, ``list(item) OVER (PARTITION BY user ORDER BY time ROWS BETWEEN max_len PRECEDING AND 1
    PRECEDING)``, lets an event see the events of its own time that precede it (and orders ties arbitrarily).
    The strict history of an event is that window's list *at the first event of its (user, time)* (ordered by
    time, then input position): the latest ``max_len`` events before that one are exactly the latest ``max_len``
    events strictly earlier than the time. ``first_value`` over (user, time) gives it to every event of the time."""
    max_len = _positive(max_len)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sql = f"""{_events_sql(files, [USER, ITEM, CATEGORY])},
    n AS (SELECT *, list({ITEM}) OVER w AS pi, list({CATEGORY}) OVER w AS pc FROM e
          WINDOW w AS (PARTITION BY {USER} ORDER BY {TIME}, pos ROWS BETWEEN {max_len} PRECEDING AND 1 PRECEDING)),
    s AS (SELECT *, coalesce(first_value(pi) OVER t, []) AS hi, coalesce(first_value(pc) OVER t, []) AS hc FROM n
          WINDOW t AS (PARTITION BY {USER}, {TIME} ORDER BY pos))
    SELECT {USER}, {ITEM}, {CATEGORY}, {SESSION},
           (({TIME} - avg({TIME}) OVER ()) / stddev_pop({TIME}) OVER ())::FLOAT AS {TIME}, {CLICK}::FLOAT AS {CLICK},
           ln(1 + greatest(coalesce({PRICE}, 0), 0))::FLOAT AS {PRICE},
           hi::INTEGER[] AS hist_{ITEM}, hc::INTEGER[] AS hist_{CATEGORY}, len(hi)::INTEGER AS hist_len
    FROM s ORDER BY {USER}, {TIME}, pos"""
    _copy(sql, out / "part-00000.parquet", threads)


def duckdb_sessions(files: Sequence[PathLike], out_dir: PathLike, max_len: int = MAX_LEN, threads: int = 2) -> None:
    """``pipelines/events_sessions.yaml`` in DuckDB SQL, as ``polars_baselines.polars_sessions``: per session, its
    last click, the item ids of its last ``max_len`` events oldest first (``list(... ORDER BY time, position)``,
    sliced) and its number of events."""
    max_len = _positive(max_len)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sql = f"""{_events_sql(files, [ITEM])}
    SELECT {SESSION}, last({CLICK} ORDER BY {TIME}, pos)::FLOAT AS {CLICK},
           list_reverse(list({ITEM} ORDER BY {TIME} DESC, pos DESC)[1:{max_len}])::INTEGER[] AS {ITEM}_list,
           count(*)::FLOAT AS {ITEM}_count
    FROM e GROUP BY {SESSION}"""
    _copy(sql, out / "part-00000.parquet", threads)


def _quoted(path: PathLike) -> str:
    """``path`` as an SQL string literal."""
    return "'" + str(Path(path)).replace("'", "''") + "'"


def _positive(n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {n!r}")
    return n


def _copy(sql: str, path: Path, threads: int) -> None:
    if duckdb is None:
        raise RuntimeError("the DuckDB baselines need duckdb (pip install --target DIR duckdb, then DIR on PYTHONPATH)")
    con = duckdb.connect()
    try:
        con.execute(f"SET threads = {int(threads)}")
        con.execute(f"COPY ({sql}) TO {_quoted(path)} (FORMAT parquet)")
    finally:
        con.close()


SCRIPTS = {"history": duckdb_history, "sessions": duckdb_sessions}


def main(argv: list[str]) -> int:
    """``history|sessions OUT_DIR SHARD...``: run that baseline; exit status 2 with a usage line otherwise."""
    if len(argv) < 3 or argv[0] not in SCRIPTS:
        print(f"usage: python -m etl.bench.duckdb_baselines {{{'|'.join(SCRIPTS)}}} OUT_DIR SHARD [SHARD ...]", file=sys.stderr)
        return 2
    SCRIPTS[argv[0]](argv[2:], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
