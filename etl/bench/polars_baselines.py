"""The naive polars versions of the two Criteo pipelines (see ``etl.bench.baselines``, which holds the rest of
the baselines and the output comparison), of the two sequence pipelines of the synthetic events
(``pipelines/events_sequence.yaml``: History; ``pipelines/events_sessions.yaml``: Groupby; compared to ours by
``etl.bench.sequences``), and the names and ids all baselines share.

This module imports nothing but polars, numpy and etl's numpy-only id constants, as a hand-written polars script
would, so that it can also run as a process of its own for an end-to-end comparison of whole processes
(``etl bench``'s ``preprocess:process`` stage)::

    python -m etl.bench.polars_baselines categorify OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.polars_baselines hash OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.polars_baselines history OUT_DIR SHARD [SHARD ...]
    python -m etl.bench.polars_baselines sessions OUT_DIR SHARD [SHARD ...]

The shards are read in the order given; the output is ``OUT_DIR/part-00000.parquet``, ... (one per shard for the
Criteo pipelines, one file for the sequence ones).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from etl.backends.hashing import check_buckets
from etl.ids import FIRST, MISSING

try:
    import polars as pl
except ImportError:  # these baselines are then unavailable (HAS_POLARS); the numpy ones still run
    pl = None  # type: ignore[assignment]
HAS_POLARS = pl is not None

LABEL = "label"
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
OUTPUT_COLUMNS = [LABEL, *DENSE, *CATS]
OOV_ID = FIRST  # the single out-of-vocabulary bucket (Categorify with oov_buckets=1)
FIRST_VOCAB_ID = FIRST + 1

#: the columns of the synthetic events (schemas/events.yaml) and the list length of the sequence pipelines
USER, ITEM, CATEGORY, SESSION, TIME, CLICK, PRICE = "user_id", "item_id", "category", "session_id", "timestamp", "click", "price"
MAX_LEN = 50
POSITION = "/position"  # a row's input position (shards in the order given, rows in file order); no schema name has "/"

PathLike = str | Path


def _part(out_dir: Path, i: int) -> Path:
    return out_dir / f"part-{i:05d}.parquet"  # the shard names of etl.io.files.shard_name


def _polars_dense() -> list[pl.Expr]:
    return [pl.col(c).fill_null(0).clip(lower_bound=0).cast(pl.Float64).log1p().cast(pl.Float32) for c in DENSE]


def polars_categorify(files: Sequence[PathLike], out_dir: PathLike, freq_threshold: int = 3) -> None:
    """Criteo categorify pipeline in plain polars (fit + transform).

    Fit: per categorical column, a lazy ``group_by().len()`` over all files; keys seen at least ``freq_threshold``
    times, ordered by count descending then by the key's hexadecimal value ascending, get ids 3, 4, ...
    Transform: ``replace_strict`` on the raw strings; missing → 1, out of vocabulary → 2.

    Output equals ``pipelines/criteo.yaml`` (Categorify with ``oov_buckets: 1``) value for value, as long as every
    key is written in one canonical case (as in Criteo's lowercase hex): this baseline matches the raw strings,
    etl matches the decoded integers."""
    paths = [Path(f) for f in files]
    out = Path(out_dir)
    vocabs: dict[str, tuple[pl.Series, pl.Series]] = {}
    for c in CATS:
        vc = (
            pl.scan_parquet(paths).select(pl.col(c)).drop_nulls().group_by(c).len()
            .filter(pl.col("len") >= freq_threshold)
            .with_columns(pl.col(c).str.to_integer(base=16).alias("key"))
            .sort(["len", "key"], descending=[True, False])
            .collect()
        )
        vocabs[c] = (vc[c], pl.Series(np.arange(FIRST_VOCAB_ID, FIRST_VOCAB_ID + vc.height, dtype=np.int32)))
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(paths):
        df = pl.read_parquet(f)
        cats = [
            pl.when(pl.col(c).is_null()).then(pl.lit(MISSING, pl.Int32)).otherwise(
                pl.col(c).replace_strict(vocabs[c][0], vocabs[c][1], default=pl.lit(OOV_ID, pl.Int32), return_dtype=pl.Int32)
            ).alias(c)
            for c in CATS
        ]
        df.select([pl.col(LABEL).cast(pl.Float32), *_polars_dense(), *cats]).write_parquet(_part(out, i))


def polars_hash(files: Sequence[PathLike], out_dir: PathLike, num_buckets: int = 40_000_000) -> None:
    """Criteo hash pipeline in plain polars: parse the hex key (``str.to_integer(base=16)``), hash it with
    polars' own ``Expr.hash(0)``, reduce modulo ``num_buckets``; id = 2 + bucket, missing → 1.

    The work is that of ``pipelines/criteo_hash.yaml`` (parse hex, hash, reduce, write), but polars' hash is not
    etl's documented fmix64 hash (nor stable across polars versions), so the ids differ from etl's by
    construction. Only the layout and ranges match: ids in ``[2, 2 + num_buckets)``, 1 for missing values."""
    check_buckets(num_buckets)
    paths = [Path(f) for f in files]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(paths):
        df = pl.read_parquet(f)
        cats = [
            pl.when(pl.col(c).is_null()).then(pl.lit(MISSING, pl.Int32)).otherwise(
                (pl.col(c).str.to_integer(base=16).hash(0) % num_buckets + FIRST).cast(pl.Int32)
            ).alias(c)
            for c in CATS
        ]
        df.select([pl.col(LABEL).cast(pl.Float32), *_polars_dense(), *cats]).write_parquet(_part(out, i))


def _polars_ids(df: pl.DataFrame, columns: Sequence[str]) -> list[pl.Expr]:
    """Categorify with ``freq_threshold: 1`` over the rows of ``df``: every key, ordered by count descending then
    by the key ascending, gets ids 3, 4, ...; missing → 1. For integer keys these are etl's ids; etl orders the
    ties of text keys by their 64-bit hash, this by the text (other ids, the same grouping)."""
    exprs = []
    for c in columns:
        vc = df.group_by(c).len().drop_nulls(c).sort(["len", c], descending=[True, False])
        ids = pl.Series(np.arange(FIRST_VOCAB_ID, FIRST_VOCAB_ID + vc.height, dtype=np.int32))
        exprs.append(pl.when(pl.col(c).is_null()).then(pl.lit(MISSING, pl.Int32)).otherwise(
            pl.col(c).replace_strict(vc[c], ids, return_dtype=pl.Int32)).alias(c))  # fmt: skip
    return exprs


def _events(files: Sequence[PathLike]) -> pl.DataFrame:
    return pl.scan_parquet([Path(f) for f in files]).with_row_index(POSITION).collect()


def polars_history(files: Sequence[PathLike], out_dir: PathLike, max_len: int = MAX_LEN) -> None:
    """``pipelines/events_sequence.yaml`` in plain polars: user, item and category ids (``_polars_ids``); per event,
    the item and category ids of the user's last ``max_len`` events whose time is strictly earlier, oldest first
    (ties in time by input position), and their number; the price's log1p, the timestamp standardised.

    The history is a rolling window over the rows sorted by (user, time, input position): ``DataFrame.rolling`` on
    the time with ``closed="left"`` (strictly earlier: events of the same time do not see each other) and a period
    longer than the data's time span, keeping the window's ``tail(max_len)``. A window over the ``max_len``
    preceding *rows* instead would let events of the same time see each other. One output file, rows in (user,
    time, input position) order."""
    df = _events(files)
    df = df.with_columns(_polars_ids(df, [USER, ITEM, CATEGORY])).sort([USER, TIME, POSITION])
    span = (df.select(pl.col(TIME).max() - pl.col(TIME).min()).item() or 0) + 1  # a period longer than the time span
    hist = df.rolling(index_column=TIME, period=f"{span}i", closed="left", group_by=USER).agg(
        pl.col(ITEM).tail(max_len).alias(f"hist_{ITEM}"), pl.col(CATEGORY).tail(max_len).alias(f"hist_{CATEGORY}"))  # fmt: skip
    t = pl.col(TIME).cast(pl.Float64)
    out = df.select(
        USER, ITEM, CATEGORY, SESSION, ((t - t.mean()) / t.std(ddof=0)).cast(pl.Float32).alias(TIME), pl.col(CLICK).cast(pl.Float32),
        pl.col(PRICE).fill_null(0).clip(lower_bound=0).log1p().cast(pl.Float32),
    ).with_columns(hist[f"hist_{ITEM}"], hist[f"hist_{CATEGORY}"], hist[f"hist_{ITEM}"].list.len().cast(pl.Int32).alias("hist_len"))  # fmt: skip
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    out.write_parquet(_part(Path(out_dir), 0))


def polars_sessions(files: Sequence[PathLike], out_dir: PathLike, max_len: int = MAX_LEN) -> None:
    """``pipelines/events_sessions.yaml`` in plain polars: item ids (``_polars_ids``); one row per session: its
    last click, the item ids of its last ``max_len`` events oldest first (ordered by time, then input position) and
    its number of events: a ``group_by`` over the rows sorted by (time, input position), which keeps that order
    within each group. One output file, sessions in no particular order."""
    df = _events(files)
    out = (
        df.with_columns(_polars_ids(df, [ITEM])).sort([TIME, POSITION])
        .group_by(SESSION).agg(pl.col(CLICK).last().cast(pl.Float32), pl.col(ITEM).tail(max_len).alias(f"{ITEM}_list"),
                               pl.len().cast(pl.Float32).alias(f"{ITEM}_count"))
    )  # fmt: skip
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    out.write_parquet(_part(Path(out_dir), 0))


SCRIPTS = {"categorify": polars_categorify, "hash": polars_hash, "history": polars_history, "sessions": polars_sessions}


def main(argv: list[str]) -> int:
    """``categorify|hash|history|sessions OUT_DIR SHARD...``: run that baseline; exit status 2 with a usage line otherwise."""
    if len(argv) < 3 or argv[0] not in SCRIPTS:
        print(f"usage: python -m etl.bench.polars_baselines {{{'|'.join(SCRIPTS)}}} OUT_DIR SHARD [SHARD ...]", file=sys.stderr)
        return 2
    SCRIPTS[argv[0]](argv[2:], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
