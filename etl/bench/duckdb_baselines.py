"""The plain DuckDB SQL versions of the two Criteo pipelines (``pipelines/criteo.yaml``, ``criteo_hash.yaml``;
compared to ours by ``etl bench``) and of the two sequence pipelines of the synthetic events, beside the polars ones
of ``etl.bench.polars_baselines`` (same outputs; compared to ours by ``etl.bench.sequences``).

DuckDB is an optional dependency of etl (the ``bench`` extra: ``pip install 'etl[bench]'``): these run where it is
importable (``HAS_DUCKDB``), also as a process::

    python -m etl.bench.duckdb_baselines categorify OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.duckdb_baselines categorify-joined OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.duckdb_baselines hash OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.duckdb_baselines history OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.duckdb_baselines sessions OUT_DIR SHARD [SHARD ...]

The shards are read in the order given. The Criteo scripts write one file per shard, ``OUT_DIR/part-00000.parquet``,
... with the layout of ``etl.bench.baselines``; the sequence ones one file, ``OUT_DIR/part-00000.parquet`` (a row's
input position: its shard's place in that order, then its row number in the file). DuckDB uses ``threads``
threads (default 2).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from etl.backends.hashing import C1, C2, check_buckets, seed_word
from etl.bench.polars_baselines import (
    CATEGORY,
    CATS,
    CLICK,
    DENSE,
    FIRST_VOCAB_ID,
    ITEM,
    LABEL,
    MAX_LEN,
    MISSING,
    OOV_ID,
    PRICE,
    SESSION,
    TIME,
    USER,
    PathLike,
)

try:
    import duckdb
except ImportError:  # these baselines are then unavailable
    duckdb = None  # type: ignore[assignment]
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
    out = _out_dir(out_dir)
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
    out = _out_dir(out_dir)
    sql = f"""{_events_sql(files, [ITEM])}
    SELECT {SESSION}, last({CLICK} ORDER BY {TIME}, pos)::FLOAT AS {CLICK},
           list_reverse(list({ITEM} ORDER BY {TIME} DESC, pos DESC)[1:{max_len}])::INTEGER[] AS {ITEM}_list,
           count(*)::FLOAT AS {ITEM}_count
    FROM e GROUP BY {SESSION}"""
    _copy(sql, out / "part-00000.parquet", threads)


_MASK64 = (1 << 64) - 1
#: SQL macros of etl's documented hash (``etl.backends.hashing``) in DuckDB's unsigned integers: a product modulo 2**64
#: is the low 64 bits of the 128-bit (UHUGEINT) product; ``hex8`` decodes an 8-hex-digit string to its key.
_MACROS = [
    "CREATE MACRO xs33(k) AS xor(k, k >> 33)",
    f"CREATE MACRO mul64(k, c) AS ((k::UHUGEINT * c::UHUGEINT) & {_MASK64}::UHUGEINT)::UBIGINT",
    f"CREATE MACRO fmix64(k) AS xs33(mul64(xs33(mul64(xs33(k), {C1})), {C2}))",
    "CREATE MACRO hex8(s) AS ('0x' || s)::UBIGINT",
]


def _criteo_dense() -> str:
    """The label and dense columns of the Criteo pipelines: float32, ``ln(1 + max(fill0(x), 0))`` in double."""
    dense = ", ".join(f"ln(1 + greatest(coalesce({c}, 0), 0))::FLOAT AS {c}" for c in DENSE)
    return f"{LABEL}::FLOAT AS {LABEL}, {dense}"


def duckdb_categorify(files: Sequence[PathLike], out_dir: PathLike, freq_threshold: int = 3, threads: int = 2) -> None:
    """``pipelines/criteo.yaml`` in DuckDB SQL, as ``polars_baselines.polars_categorify`` (same output).

    Fit: per categorical column, a ``GROUP BY`` of the raw strings over all files; the strings seen at least
    ``freq_threshold`` times, ordered by count descending then by their hexadecimal value ascending, get ids 3, 4, ...
    (a temporary table per column). Transform, file by file: a ``LEFT JOIN`` of each column on its vocabulary;
    missing → 1, out of vocabulary → 2; rows in file order (``ORDER BY`` the file's row number: a join does not
    keep it). Like the polars script it matches the raw strings, so it equals etl's output as long as every key is
    written in one case (as in Criteo's lowercase hex)."""
    out = _out_dir(out_dir)
    fit, ids, joins = _categorify_sql(files, freq_threshold)
    transform = [f"COPY (SELECT {_criteo_dense()}, {ids} FROM read_parquet({_quoted(f)}, file_row_number=true) r {joins} "
                 f"ORDER BY r.file_row_number) TO {_quoted(out / _part_name(i))} (FORMAT parquet)" for i, f in enumerate(files)]  # fmt: skip
    _execute([*_MACROS, *fit, *transform], threads)


def duckdb_categorify_joined(files: Sequence[PathLike], out_dir: PathLike, freq_threshold: int = 3, threads: int = 2) -> None:
    """``duckdb_categorify`` trading memory for time: the same fit, then the ``LEFT JOIN`` of every file at once
    into a temporary table, written out file by file in row order (``ORDER BY`` the file's row number: the join
    does not keep it). One join of the 26 vocabularies instead of one per file; the whole output held in memory.
    Same output."""
    out = _out_dir(out_dir)
    fit, ids, joins = _categorify_sql(files, freq_threshold)
    every = "[" + ", ".join(_quoted(f) for f in files) + "]"
    joined = (f"CREATE TEMP TABLE joined AS SELECT r.filename AS f, r.file_row_number AS n, {_criteo_dense()}, {ids} "
              f"FROM read_parquet({every}, filename=true, file_row_number=true) r {joins}")  # fmt: skip
    write = [f"COPY (SELECT * EXCLUDE (f, n) FROM joined WHERE f = {_quoted(f)} ORDER BY n) TO {_quoted(out / _part_name(i))} (FORMAT parquet)"
             for i, f in enumerate(files)]  # fmt: skip
    _execute([*_MACROS, *fit, joined, *write], threads)


def _categorify_sql(files: Sequence[PathLike], freq_threshold: int) -> tuple[list[str], str, str]:
    """The categorify scripts' SQL: the statements of the fit (a vocabulary table ``v_C1``... per categorical
    column), the select list of the ids of the rows ``r`` and the joins that give them."""
    if not isinstance(freq_threshold, int) or freq_threshold < 1:
        raise ValueError(f"freq_threshold must be an integer >= 1, got {freq_threshold!r}")
    every = "[" + ", ".join(_quoted(f) for f in files) + "]"
    fit = [f"CREATE TEMP TABLE v_{c} AS SELECT s, (row_number() OVER (ORDER BY n DESC, hex8(s)) + {FIRST_VOCAB_ID - 1})::INTEGER AS id "
           f"FROM (SELECT {c} AS s, count(*) AS n FROM read_parquet({every}) WHERE {c} IS NOT NULL GROUP BY {c}) WHERE n >= {freq_threshold}"
           for c in CATS]  # fmt: skip
    ids = ", ".join(f"(CASE WHEN r.{c} IS NULL THEN {MISSING} ELSE coalesce(v_{c}.id, {OOV_ID}) END)::INTEGER AS {c}" for c in CATS)
    joins = " ".join(f"LEFT JOIN v_{c} ON r.{c} = v_{c}.s" for c in CATS)
    return fit, ids, joins


def duckdb_hash(files: Sequence[PathLike], out_dir: PathLike, num_buckets: int = 40_000_000, seed: int = 0, threads: int = 2) -> None:
    """``pipelines/criteo_hash.yaml`` in DuckDB SQL: decode the 8-hex-digit keys, then etl's documented hash
    (``fmix64(key XOR seed_word(seed))``, ``reduce(h, n) = ((h >> 32) * n) >> 32``, id = 2 + bucket, missing → 1) in
    SQL macros; output equal to etl's bit for bit (40 M buckets, seed 0), one file per shard."""
    check_buckets(num_buckets)
    out = _out_dir(out_dir)
    word = seed_word(seed)
    # a missing key's NULL goes through the arithmetic to coalesce (a CASE would keep DuckDB from computing the
    # macros' repeated subexpressions once)
    ids = ", ".join(f"coalesce(({OOV_ID} + ((fmix64(xor(hex8({c}), {word}::UBIGINT)) >> 32) * {num_buckets}::UBIGINT >> 32))::INTEGER, "
                    f"{MISSING}) AS {c}" for c in CATS)  # fmt: skip
    transform = [f"COPY (SELECT {_criteo_dense()}, {ids} FROM read_parquet({_quoted(f)})) TO {_quoted(out / _part_name(i))} (FORMAT parquet)"
                 for i, f in enumerate(files)]  # fmt: skip
    _execute([*_MACROS, *transform], threads)


def _out_dir(out_dir: PathLike) -> Path:
    """``out_dir``, created if need be."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _part_name(i: int) -> str:
    return f"part-{i:05d}.parquet"  # the shard names of etl.io.files.shard_name


def _quoted(path: PathLike) -> str:
    """``path`` as an SQL string literal."""
    return "'" + str(Path(path)).replace("'", "''") + "'"


def _positive(n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {n!r}")
    return n


def _copy(sql: str, path: Path, threads: int) -> None:
    _execute([f"COPY ({sql}) TO {_quoted(path)} (FORMAT parquet)"], threads)


def _execute(statements: list[str], threads: int) -> None:
    """Run ``statements`` in order on a fresh in-memory DuckDB database with ``threads`` threads."""
    if duckdb is None:
        raise RuntimeError("the DuckDB baselines need duckdb (pip install 'etl[bench]')")
    con = duckdb.connect()
    try:
        con.execute(f"SET threads = {int(threads)}")
        for sql in statements:
            con.execute(sql)
    finally:
        con.close()


SCRIPTS: dict[str, Callable[[Sequence[PathLike], PathLike], None]] = {
    "categorify": duckdb_categorify, "categorify-joined": duckdb_categorify_joined, "hash": duckdb_hash, "history": duckdb_history,
    "sessions": duckdb_sessions,
}  # fmt: skip


def main(argv: list[str]) -> int:
    """``categorify|hash|history|sessions OUT_DIR SHARD...``: run that baseline; exit status 2 with a usage line otherwise."""
    if len(argv) < 3 or argv[0] not in SCRIPTS:
        print(f"usage: python -m etl.bench.duckdb_baselines {{{'|'.join(SCRIPTS)}}} OUT_DIR SHARD [SHARD ...]", file=sys.stderr)
        return 2
    SCRIPTS[argv[0]](argv[2:], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
