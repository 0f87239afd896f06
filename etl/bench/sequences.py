"""`etl bench --sequences`: the sequence features (History, Groupby) on synthetic behaviour events, offline and
streaming, beside the obvious polars and DuckDB scripts doing the same work.

The input: ``rows`` events of ``schemas/events.yaml`` in ``files`` shards (``etl generate``), or the shards given.
Every figure is the median of ``repeat`` runs (after one warm-up run where said), in wall seconds, with the median
CPU seconds in its note (``Timing``). For ``pipelines/events_sequence.yaml``
(Decode, Categorify, History of the last 50 items and categories, dense ops):

- ``floor``: bare Parquet read of the schema's columns (``etl.bench.run.measure_floor``);
- ``fit``, ``preprocess`` (the transform: exchange by key, History, write) and ``fit+preprocess``, in the process,
  ``workers`` threads; ``preprocess:process``: ``etl preprocess`` as a user runs it (start-up, fit, transform,
  write), wall time;
- ``loader:no-history`` and ``loader:history``: one epoch of the ``Loader`` on the raw shards (``shuffle=False``:
  History's streaming state needs each key's time order; ``allowed_lateness`` the generator's ``lateness``) with
  the pipeline without its History op, then with it (its note gives the ratio); each after a warm-up epoch.

For ``pipelines/events_sessions.yaml`` (Categorify, Groupby of sessions): ``fit``, ``preprocess``,
``fit+preprocess`` and ``preprocess:process``.

Baselines (``run_baselines``): ``polars`` (``etl.bench.polars_baselines``) and, where duckdb is importable,
``duckdb`` (``etl.bench.duckdb_baselines``), each as a process (``python -m ...``) against ``preprocess:process``;
their outputs must hold our lists (``same_history``, ``same_sessions``): RuntimeError otherwise.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl
import yaml

from etl.bench import duckdb_baselines
from etl.bench.polars_baselines import CATEGORY, ITEM, SESSION, USER
from etl.bench.report import PipelineReport, Report, Stage
from etl.bench.run import _child_env, measure_floor, preprocess_command
from etl.io.fs import Location, fingerprint
from etl.io.parquet import list_shards
from etl.loader import Loader
from etl.loader.order import row_groups
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.resources import resource_path
from etl.tools.synth import generate

HISTORY_COLUMNS = [USER, ITEM, "hist_len", f"hist_{ITEM}"]


class Timing(NamedTuple):
    """Median wall seconds and median CPU seconds (this process's threads and the child processes it waited for)
    of repeated runs; on a machine shared with other jobs the CPU seconds are the steadier figure."""

    wall: float
    cpu: float

    def note(self, repeat: int) -> str:
        return f"median of {repeat}; CPU {self.cpu:.2f} s"


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn: Callable[[], object], repeat: int) -> Timing:
    """The ``Timing`` of ``repeat`` calls of ``fn``."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _cpu()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    return Timing(statistics.median(walls), statistics.median(cpus))


def process_seconds(command: list[str], out: Path, repeat: int) -> Timing:
    """The ``Timing`` of ``repeat`` runs of ``command``, a whole process writing into ``out`` (removed before each
    run, left with the last run's files). RuntimeError with the end of its stderr when it fails."""
    def once() -> None:
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(command, capture_output=True, text=True, env=_child_env())
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed (exit status {proc.returncode}): {proc.stderr[-2000:]}")

    return timed(once, repeat)


def _read(directory: Path, columns: list[str]) -> pl.DataFrame:
    return pl.read_parquet(sorted(directory.glob("part-*.parquet")), columns=columns)


def same_history(ours: Path, theirs: Path) -> str | None:
    """None when the output of ``theirs`` holds the rows of ``ours`` (History of ``events_sequence.yaml``), else
    what differs. Rows are matched as a multiset (the outputs order rows differently): user and item ids, history
    length and item list must be equal; category ids may be numbered otherwise (etl orders ties of text keys by
    their hash, the baselines by the text), so the category column and lists must map one to one onto ours."""
    def rows(d: Path) -> pl.DataFrame:
        df = _read(d, [*HISTORY_COLUMNS, CATEGORY, f"hist_{CATEGORY}"])
        return df.with_columns(pl.col(f"hist_{ITEM}").hash().alias("/h")).sort([USER, ITEM, "hist_len", "/h"])

    a, b = rows(ours), rows(theirs)
    if a.height != b.height:
        return f"{a.height:,} rows in ours, {b.height:,} in theirs"
    for c in HISTORY_COLUMNS:
        differ = a[c].ne_missing(b[c]).arg_true()
        if len(differ):
            i = differ[0]
            return f"{c}: ours {a.row(i, named=True)}, theirs {b.row(i, named=True)} ({len(differ):,} rows differ)"
    cats = pl.DataFrame({"ours": pl.concat([a[CATEGORY], a[f"hist_{CATEGORY}"].explode()]),
                         "theirs": pl.concat([b[CATEGORY], b[f"hist_{CATEGORY}"].explode()])}).drop_nulls().unique()  # fmt: skip
    if not cats.height == cats["ours"].n_unique() == cats["theirs"].n_unique():
        return "category ids do not map one to one onto ours"
    return None


def same_sessions(ours: Path, theirs: Path) -> str | None:
    """None when the output of ``theirs`` equals ours (Groupby of ``events_sessions.yaml``) session for session,
    else what differs."""
    columns = [SESSION, "click", f"{ITEM}_list", f"{ITEM}_count"]
    a, b = (_read(d, columns).sort(SESSION) for d in (ours, theirs))
    if a.height != b.height:
        return f"{a.height:,} sessions in ours, {b.height:,} in theirs"
    for c in columns:
        differ = a[c].ne_missing(b[c]).arg_true()
        if len(differ):
            return f"{c}: ours {a.row(differ[0], named=True)}, theirs {b.row(differ[0], named=True)} ({len(differ):,} sessions differ)"
    return None


def streaming_docs(p: Pipeline, lateness: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The docs of ``p`` for the loader on raw shards: with its History op allowing ``lateness`` (and the schema's
    absolute path), and the same without History."""
    schema = str((Path(p.path).parent / p.doc["schema"]).resolve())
    ops = [op | {"allowed_lateness": lateness} if op["op"] == "History" else op for op in p.doc["ops"]]
    return ({**p.doc, "schema": schema, "ops": ops},
            {**p.doc, "name": f"{p.name}_no_history", "schema": schema, "ops": [op for op in ops if op["op"] != "History"]})  # fmt: skip


def loader_seconds(doc: dict[str, Any], shards: list[Location], work: Path, workers: int, batch_size: int, repeat: int) -> Timing:
    """The ``Timing`` of an epoch of the loader on ``shards`` (no shuffle, a consumer doing nothing) with the
    pipeline of ``doc`` (fitted and saved into ``work``), after a warm-up epoch."""
    path = work / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    p = Pipeline.from_file(path)
    p.fit(shards, workers=workers)
    p.save(work / f"art-{doc['name']}")
    loader = Loader(shards, pipeline=path, artifacts=work / f"art-{doc['name']}", batch_size=batch_size, shuffle=False, num_workers=workers)
    try:
        def epoch() -> None:
            loader.set_epoch(loader.epoch + 1)
            for _ in loader:
                pass

        epoch()
        return timed(epoch, repeat)
    finally:
        loader.close()


def measure_offline(path: Path, shards: list[Location], input_dir: Location, work: Path, workers: int, repeat: int, rep: PipelineReport,
                    total: int, mbytes: float) -> Path:  # fmt: skip
    """``fit``, ``preprocess``, ``fit+preprocess`` and ``preprocess:process`` of the pipeline file ``path`` into
    ``rep``; return the directory of the in-process output."""
    fitted: list[Pipeline] = []

    def fit() -> None:  # a fresh pipeline each time: fitting a fitted one does nothing
        fitted.append(Pipeline.from_file(path))
        fitted[-1].fit(shards, workers=workers)

    fit()  # warm-up: compiled kernels, page cache
    fit_time = timed(fit, repeat)
    p = fitted[-1]
    out = work / f"ours-{p.name}"

    def transform() -> None:
        shutil.rmtree(out, ignore_errors=True)
        preprocess(p, shards, out, workers=workers)

    transform()  # warm-up: History's and Groupby's kernels
    ours = timed(transform, repeat)
    proc = process_seconds(preprocess_command(path, input_dir, work / f"process-{p.name}", workers), work / f"process-{p.name}", repeat)
    both = Timing(fit_time.wall + ours.wall, fit_time.cpu + ours.cpu)
    rep.stages += [Stage("fit", fit_time.wall, total, mbytes, fit_time.note(repeat)),
                   Stage("preprocess", ours.wall, total, mbytes, f"offline transform to Parquet; {ours.note(repeat)}"),
                   Stage("fit+preprocess", both.wall, total, mbytes, f"in this process; CPU {both.cpu:.2f} s"),
                   Stage("preprocess:process", proc.wall, total, mbytes, f"etl preprocess, the whole process; {proc.note(repeat)}")]  # fmt: skip
    return out


def measure_baselines(kind: str, local: list[Path], ours: Path, work: Path, repeat: int, rep: PipelineReport, total: int,
                      progress: Callable[[str], None]) -> None:  # fmt: skip
    """The polars and (where importable) DuckDB scripts of ``kind`` (history or sessions) as processes, their
    outputs checked against ``ours``; into ``rep.baselines``, against ``preprocess:process``."""
    ours_seconds = next(s.seconds for s in rep.stages if s.name == "preprocess:process")  # wall
    same = same_history if kind == "history" else same_sessions
    engines = {"polars": "etl.bench.polars_baselines"} | ({"duckdb": "etl.bench.duckdb_baselines"} if duckdb_baselines.HAS_DUCKDB else {})
    for name, module in engines.items():
        progress(f"{kind}: {name} baseline")
        out = work / f"{name}-{kind}"
        t = process_seconds([sys.executable, "-m", module, kind, str(out), *map(str, local)], out, repeat)
        why = same(ours, out)
        if why is not None:
            raise RuntimeError(f"the {name} {kind} script's output differs from ours: {why}")
        rep.baselines[name] = {"seconds": t.wall, "cpu_seconds": t.cpu, "rows_per_second": total / t.wall, "speedup_of_ours": t.wall / ours_seconds,
                               "output_equal": True, "versus": "etl preprocess process"}  # fmt: skip


def run_sequences_bench(
    *,
    input_dir: Location | None = None,
    rows: int = 1_000_000,
    files: int = 8,
    workers: int = 2,
    batch_size: int = 65536,
    repeat: int = 3,
    run_baselines: bool = True,
    progress: Callable[[str], None] = lambda msg: None,
) -> Report:
    """Measure as the module docstring says, on the shards of ``input_dir`` (events of ``schemas/events.yaml``) or
    on ``rows`` generated ones in ``files`` shards; temporary files live in a directory removed at the end."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    work = Path(tempfile.mkdtemp(prefix="etl-bench-seq-"))
    try:
        sequence, sessions = resource_path("pipelines", "events_sequence.yaml"), resource_path("pipelines", "events_sessions.yaml")
        history = Pipeline.from_file(sequence)
        if input_dir is None:
            progress(f"generating {rows:,} synthetic events")
            input_dir = work / "raw"
            generate(history.schema, rows, files, input_dir, seed=0)
        shards = list_shards(input_dir)
        groups = row_groups(shards)
        total = sum(g.num_rows for g in groups)
        mbytes = sum(fingerprint(s)[0] for s in shards) / 1e6
        report = Report(total, len(shards), mbytes, workers, batch_size, "cpu")
        local = [s for s in shards if isinstance(s, Path)]
        with_baselines = run_baselines and len(local) == len(shards)  # the scripts read local files
        for path, kind in ((sequence, "history"), (sessions, "sessions")):
            rep = PipelineReport(str(path))
            report.pipelines.append(rep)
            p = Pipeline.from_file(path)
            progress(f"{p.name}: floor")
            rep.stages.append(Stage("floor", measure_floor(groups, p.schema.names, workers), total, mbytes, "bare Parquet read"))
            progress(f"{p.name}: fit and preprocess")
            ours = measure_offline(path, shards, input_dir, work, workers, repeat, rep, total, mbytes)
            if kind == "history":
                progress(f"{p.name}: loaders on raw shards")
                events = p.schema.events
                with_history, without = streaming_docs(p, events.lateness if events is not None else 0)
                bare = loader_seconds(without, shards, work, workers, batch_size, repeat)
                streamed = loader_seconds(with_history, shards, work, workers, batch_size, repeat)
                rep.stages += [
                    Stage("loader:no-history", bare.wall, total, mbytes, f"raw shards, shuffle=False, without History; {bare.note(repeat)}"),
                    Stage("loader:history", streamed.wall, total, mbytes,
                          f"the same with History's streaming state: {streamed.wall / bare.wall:.2f}x the time; {streamed.note(repeat)}"),
                ]
            if with_baselines:
                measure_baselines(kind, local, ours, work, repeat, rep, total, progress)
        report.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)
