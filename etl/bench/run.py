"""`etl bench`: the standalone throughput test. Everything is measured in one run, on the same files:

- ``floor``: bare Parquet read of the columns the pipeline reads (polars, row group by row group, worker threads);
- stages, one thread, on row groups already in memory: ``columns`` (Arrow → numpy views), each op of the
  pipeline, ``output`` (checks, typed Arrow table), ``batch`` (the loader's field layout), ``ring`` (copy into a
  batch slot), and ``h2d`` (slot → device) when CUDA is present;
- ``fit`` over all shards and ``preprocess`` (offline, all shards → Parquet), each the best of two runs (the first
  also loads compiled kernels and touches fresh memory), and ``loader`` (one shuffled epoch to a
  consumer that does nothing) with ``workers`` threads, in rows/s and input MB/s (Parquet bytes);
- ``preprocess:process``: ``etl preprocess`` of the raw shards as a user runs it, a process of its own
  (``python -m etl preprocess``: start-up, fit, transform, write), wall time, best of two; its output must equal
  the in-process ``preprocess``'s. With the baselines, the naive polars script runs as a process the same way
  (``python -m etl.bench.polars_baselines``), best of two, its output compared to ours where it computes the same
  ids: the ``polars:process`` baseline, whose ``speedup_of_ours`` is the ratio of the two processes' times; and so
  does the DuckDB SQL script (``etl.bench.duckdb_baselines``, output equal to ours), ``duckdb:process``, where duckdb
  is importable (the stage's note says when it is skipped);
- given a Dask client (``--cluster``), ``preprocess:cluster``: the same preprocess with its shards on the cluster's
  workers, best of two, beside the threaded figure (its note gives the ratio); its output must equal the threaded
  one;
- ``stall``: a consumer whose step costs ``step_factor`` × the loader's own time per batch (``time.sleep``; a
  GPU step leaves the cores to the loader), over two consecutive epochs (the second is what later epochs of a
  training run see: its first batches were prepared while the first epoch drained), or the DLRM of
  ``etl.bench.dlrm`` (the model of scripts/train_dlrm.py): the share of time it waited;
- with device placement (``device_placement``; on by default with CUDA): the stages of the pipeline's device
  part (``etl.bench.device``: host part, ring, ``h2d``, each op on the device) and a loader epoch with
  ``transform_on="device"`` and its stall;
- with ``reader="cudf"`` (``--reader cudf``; a GPU with cudf): ``cudf:loader``, a loader epoch whose row groups cudf
  decodes into GPU memory (``Loader(reader="cudf")``), its stall in the note, beside the default reader's rows;
- peak memory (resident set size of this process);
- baselines: the naive polars and pyarrow+numpy scripts of ``etl.bench.baselines`` doing the same work (best of two
  runs, as ours), with their outputs compared to ours.

The results are the dataclasses of ``etl.bench.report``.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import etl
from etl.bench import baselines, duckdb_baselines, polars_baselines
from etl.bench.device import measure_device_stages
from etl.bench.dlrm import DLRM
from etl.bench.report import PipelineReport, Report, Stage
from etl.io.fs import Location, fingerprint
from etl.io.parquet import batch_from_arrow, list_shards, read_rows
from etl.io.processed import MANIFEST, read_manifest
from etl.loader import Loader
from etl.loader.chunk import Chunk, Layout
from etl.loader.order import row_groups
from etl.loader.ring import Ring
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.runtime.workers import run_workers
from etl.tools.synth import generate

if TYPE_CHECKING:
    from distributed import Client

BASELINES: dict[str, dict[str, Callable[[list[Path], Path], None]]] = {  # the polars ones only where polars is installed
    "Categorify": {"polars": polars_baselines.polars_categorify, "numpy": baselines.numpy_categorify},
    "Hash": {"polars": polars_baselines.polars_hash, "numpy": baselines.numpy_hash},
}
if not polars_baselines.HAS_POLARS:
    BASELINES = {kind: {k: f for k, f in fns.items() if k != "polars"} for kind, fns in BASELINES.items()}
EXACT = {"Categorify": ("polars", "numpy", "duckdb"), "Hash": ("numpy", "duckdb")}  # baselines whose output must equal ours
#: the scripts run as whole processes beside ``etl preprocess``: polars where installed, DuckDB where importable
PROCESS_SCRIPTS = ({"polars": "etl.bench.polars_baselines"} if polars_baselines.HAS_POLARS else {}) | (
    {"duckdb": "etl.bench.duckdb_baselines"} if duckdb_baselines.HAS_DUCKDB else {})  # fmt: skip
NO_DUCKDB = "the DuckDB script is skipped: duckdb is not importable (pip install 'etl[bench]')"


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_floor(groups: list, columns: list[str], workers: int) -> float:
    """Seconds to read every row group of ``columns`` with ``workers`` threads (the floor of any pipeline);
    the best of two runs, so that both pipelines are measured with a warm page cache."""
    def read_all() -> float:
        return _timed(lambda: run_workers(groups, workers, lambda w, g, stop: read_rows(g.path, columns, g.first_row, g.num_rows, g.index)))

    return min(read_all(), read_all())


def measure_fit(pipeline: Pipeline, shards: list[Location], workers: int) -> float:
    """Seconds to fit ``pipeline`` over ``shards``: the best of two runs (the first on an unfitted copy, which
    also loads the compiled kernels from numba's cache and touches fresh memory); ``pipeline`` ends fitted."""
    first = _timed(lambda: Pipeline(pipeline.doc, pipeline.schema, pipeline.path, pipeline.xp).fit(shards, workers=workers))
    return min(first, _timed(lambda: pipeline.fit(shards, workers=workers)))


def measure_cluster_preprocess(pipeline: Pipeline, shards: list[Location], work: Path, client: Client, threaded: Path) -> float:
    """Seconds of ``preprocess`` of the fitted ``pipeline`` with its shards on the cluster of ``client`` (into
    directories of ``work``): the best of two runs (the first also loads the pipeline on the workers). Its manifest,
    which holds the checksum of every output file, must equal that of the threaded run into ``threaded``;
    RuntimeError otherwise."""
    best = float("inf")
    for k in range(2):
        out = work / f"cluster{k}-{pipeline.name}"
        best = min(best, preprocess(pipeline, shards, out, client=client).transform_seconds)
        if (out / MANIFEST).read_bytes() != (threaded / MANIFEST).read_bytes():
            raise RuntimeError(f"preprocess on the cluster wrote other files than the threaded run ({out}, {threaded})")
        shutil.rmtree(out, ignore_errors=True)
    return best


def _child_env() -> dict[str, str]:
    """This process's environment with the directory that holds the ``etl`` package first on PYTHONPATH, so that a
    child ``python -m etl ...`` runs this same code."""
    root = str(Path(etl.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else root + os.pathsep + path}


def measure_process(command: list[str], out: Path) -> float:
    """Wall seconds of ``command``, a whole process that writes into ``out`` (removed before each run, left with
    the second run's files): the best of two runs. RuntimeError with the end of its stderr when it fails."""
    best = float("inf")
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=_child_env())
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed (exit status {proc.returncode}): {proc.stderr[-2000:]}")
        best = min(best, seconds)
    return best


def preprocess_command(pipeline: Path, input_dir: Location, out: Path, workers: int) -> list[str]:
    """``etl preprocess`` of the shards of ``input_dir`` into ``out``, fitting first, as a command line."""
    return [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(pipeline), "--input", str(input_dir), "--out", str(out),
            "--workers", str(workers)]  # fmt: skip


def measure_processes(
    pipeline: Path, name: str, kind: str, input_dir: Location, local: list[Path] | None, work: Path, workers: int, ours: Path
) -> tuple[float, dict[str, tuple[float, bool | None]]]:
    """(seconds of ``etl preprocess`` as a process; per script, polars and DuckDB where importable: the seconds of
    its process and whether its output equals ours, None when it computes other ids), as the module docstring says.

    ``kind`` is the pipeline's fitted op (``_fitted_op``), ``local`` the shards for the scripts (None: no script
    runs), ``ours`` the output of the in-process preprocess. The process's output must equal ``ours``, and so must
    each script's where it computes the same ids: RuntimeError otherwise."""
    out = work / f"process-{name}"
    seconds = measure_process(preprocess_command(pipeline, input_dir, out, workers), out)
    if (out / MANIFEST).read_bytes() != (ours / MANIFEST).read_bytes():
        raise RuntimeError(f"etl preprocess as a process wrote other files than the in-process run ({out}, {ours})")
    shutil.rmtree(out, ignore_errors=True)
    scripts: dict[str, tuple[float, bool | None]] = {}
    if local is None or kind not in EXACT:
        return seconds, scripts
    for engine, module in PROCESS_SCRIPTS.items():
        script = work / f"{engine}-process-{name}"
        theirs = measure_process([sys.executable, "-m", module, kind.lower(), str(script), *map(str, local)], script)
        equal = baselines.same_output(script, ours) if engine in EXACT[kind] else None
        if equal is False:
            raise RuntimeError(f"the {engine} script's output differs from ours for {pipeline}: {baselines.first_difference(script, ours)}")
        shutil.rmtree(script, ignore_errors=True)
        scripts[engine] = (theirs, equal)
    return seconds, scripts


def measure_stages(pipeline: Pipeline, tables: list, batch_size: int, device: torch.device) -> list[Stage]:
    """One thread, data in memory: the time of each step of the transform and of the loader's batch path; the
    best of two passes (the first one also pays for first-touch page faults of fresh allocations)."""
    passes = [_stage_seconds(pipeline, tables, batch_size, device) for _ in range(2)]
    rows = sum(t.num_rows for t in tables)
    return [Stage(name, min(p[name] for p in passes), rows) for name in passes[0]]


def _stage_seconds(pipeline: Pipeline, tables: list, batch_size: int, device: torch.device) -> dict[str, float]:
    spent: dict[str, float] = {"columns": 0.0, **{f"{i}:{op.name}": 0.0 for i, op in enumerate(pipeline.ops)}, "output": 0.0}
    outputs = []
    for table in tables:
        t0 = time.perf_counter()
        batch = batch_from_arrow(table, pipeline.schema)
        spent["columns"] += time.perf_counter() - t0
        for i, op in enumerate(pipeline.ops):
            t0 = time.perf_counter()
            batch = batch.with_columns(op.transform(batch, pipeline.xp))
            spent[f"{i}:{op.name}"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        pipeline.check_output(batch)
        outputs.append(pipeline.to_arrow(batch))
        spent["output"] += time.perf_counter() - t0
    layout = Layout.of(pipeline)
    t0 = time.perf_counter()
    chunks = [Chunk.from_table(t, layout) for t in outputs]
    spent["batch"] = time.perf_counter() - t0
    ring = Ring(2, max(batch_size, max(c.n for c in chunks)), layout.batch_fields(), device)
    fill = ship = 0.0
    for c in chunks:
        slot = ring.acquire_free()
        t0 = time.perf_counter()
        ring.fill(slot, c.fixed, c.n)
        t1 = time.perf_counter()
        ring.ship(slot, c.n)
        ring.view(slot, c.n)
        if ring.cuda:
            torch.cuda.synchronize(device)
        fill, ship = fill + t1 - t0, ship + time.perf_counter() - t1
        ring.release(slot)
    spent["ring"] = fill
    if ring.cuda:
        spent["h2d"] = ship
    return spent


def next_epoch(loader: Loader) -> None:
    """One pass over the next epoch, the consumer doing nothing."""
    loader.set_epoch(loader.epoch + 1)
    for _ in loader:
        pass


def measure_loader(loader: Loader, step_factor: float) -> tuple[float, float, float, list[float]]:
    """(seconds of one epoch with a consumer doing nothing, after a warm-up epoch; data wait of the first and of the
    second of two epochs whose step costs ``step_factor`` × the loader's time per batch; the second's per-batch
    waits)."""
    next_epoch(loader)  # warm-up: page cache, compiled kernels, tables
    seconds = _timed(lambda: next_epoch(loader))
    step = step_factor * seconds / len(loader)
    first, _ = measure_stall(loader, step)
    wait, timeline = measure_stall(loader, step)
    return seconds, first, wait, timeline


def measure_processed_loaders(
    p: Pipeline, shards: list[Location], work: Path, workers: int, batch_size: int, device: str, step_factor: float,
    progress: Callable[[str], None],
) -> list[Stage]:  # fmt: skip
    """The default engine on the Parquet files and the DALI engine on the npy chunks of one ``--format
    parquet,npy`` output of ``p`` (fitted and saved in ``work``), each a shuffled epoch after a warm-up one."""
    progress(f"{p.name}: preprocess to parquet,npy")
    out = work / f"npy-{p.name}"
    preprocess(p, shards, out, workers=workers, artifacts=work / f"art-{p.name}", formats=("parquet", "npy"))
    total = sum(e.rows_out for e in read_manifest(out).files)
    stages = []
    for engine, name, what in (("default", "loader:processed", "Parquet files"), ("dali", "loader:dali", "npy chunks, DALI's numpy reader")):
        progress(f"{p.name}: {name}")
        loader = Loader(out, engine=engine, batch_size=batch_size, shuffle=True, seed=0, device=device, num_workers=workers)
        seconds, _, _, _ = measure_loader(loader, step_factor)
        loader.close()
        stages.append(Stage(name, seconds, total, 0.0, f"preprocessed output ({what}), shuffled epoch"))
    return stages


def measure_stall(loader: Loader, step_seconds: float, model: Callable | None = None) -> tuple[float, list[float]]:
    """Data-wait share and per-batch waits of the next epoch (``set_epoch(epoch + 1)``, as a training loop does)
    for a consumer that sleeps ``step_seconds`` per batch (or runs ``model`` on it)."""
    loader.set_epoch(loader.epoch + 1)
    waits = []
    last = loader.stats.wait_seconds
    t0 = time.perf_counter()
    for batch in loader:
        waits.append(loader.stats.wait_seconds - last)
        last = loader.stats.wait_seconds
        if model is not None:
            model(batch)
        else:
            time.sleep(step_seconds)
    if model is not None and loader.device.type == "cuda":
        torch.cuda.synchronize(loader.device)
    return sum(waits) / (time.perf_counter() - t0), waits


def dlrm_step(loader: Loader) -> Callable:
    """A training step (SGD, binary cross-entropy) of a ``DLRM`` sized for ``loader``'s batches: tables of at most
    100,000 rows, embeddings of width 16, on the loader's device."""
    cards = loader.pipeline.cardinalities()
    model = DLRM(len(loader.layout.dense), [min(cards[c], 100_000) for c in loader.layout.sparse], 16).to(loader.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def step(batch) -> None:
        if len(batch):
            loss = loss_fn(model(batch.dense, batch.sparse), batch.label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return step


def _fitted_op(pipeline: Pipeline) -> str:
    names = {op.name for op in pipeline.ops}
    return "Categorify" if "Categorify" in names else "Hash" if "Hash" in names else ""


def run_bench(
    pipelines: list[Path],
    *,
    input_dir: Location | None = None,
    rows: int = 2_000_000,
    files: int = 8,
    workers: int = 2,
    batch_size: int = 65536,
    device: str = "cpu",
    step_factor: float = 1.25,
    model: bool = False,
    run_baselines: bool = True,
    device_placement: bool | None = None,
    reader: str = "cpu",
    progress: Callable[[str], None] = lambda msg: None,
    client: Client | None = None,
    engines: tuple[str, ...] = (),
) -> Report:
    """Measure each of ``pipelines`` as the module docstring says (with ``"dali"`` in ``engines``, also the loader on
    a preprocessed output: the default engine on its Parquet files, rows "loader:processed", and the DALI engine on
    its npy chunks, "loader:dali"), on the shards of ``input_dir`` or, without it, on
    ``rows`` synthetic rows in ``files`` shards generated from the first pipeline's schema; with a Dask ``client``,
    preprocess on its cluster too. Temporary files (synthetic shards, artifacts, outputs) live in a temporary
    directory removed at the end (on the cluster's shared storage when its workers are on other machines: see
    ``tempfile``, TMPDIR)."""
    work = Path(tempfile.mkdtemp(prefix="etl-bench-"))
    try:
        first = Pipeline.from_file(pipelines[0])
        if input_dir is None:
            progress(f"generating {rows:,} synthetic rows")
            input_dir = work / "raw"
            generate(first.schema, rows, files, input_dir, seed=0)
        shards = list_shards(input_dir)
        groups = row_groups(shards)
        total = sum(g.num_rows for g in groups)
        mbytes = sum(fingerprint(p)[0] for p in shards) / 1e6
        dev = torch.device(device)
        report = Report(total, len(shards), mbytes, workers, batch_size, device)
        progress("reading the shards into memory")
        tables = [read_rows(g.path, first.schema.names, g.first_row, g.num_rows, g.index) for g in groups]
        for path in pipelines:
            rep = PipelineReport(str(path))
            report.pipelines.append(rep)
            p = Pipeline.from_file(path)
            progress(f"{p.name}: floor")
            rep.stages.append(Stage("floor", measure_floor(groups, p.schema.names, workers), total, mbytes, "bare Parquet read"))
            if not p.is_fitted:
                progress(f"{p.name}: fit")
                rep.stages.append(Stage("fit", measure_fit(p, shards, workers), total, mbytes, "best of two"))
            p.save(work / f"art-{p.name}")
            progress(f"{p.name}: stages")
            rep.stages.extend(measure_stages(p, tables, batch_size, dev))
            loader_args = dict(pipeline=path, artifacts=work / f"art-{p.name}", batch_size=batch_size, shuffle=True, seed=0,
                               device=device, num_workers=workers)  # fmt: skip
            if device_placement if device_placement is not None else dev.type == "cuda":
                progress(f"{p.name}: device placement stages")
                rep.stages.extend(Stage(name, secs, total) for name, secs in measure_device_stages(p, tables, batch_size, dev))
                progress(f"{p.name}: loader, device placement")
                dloader = Loader(input_dir, transform_on="device", **loader_args)
                seconds, _, rep.device_data_wait, _ = measure_loader(dloader, step_factor)
                rep.stages.append(Stage("dp:loader", seconds, total, mbytes, "end to end, shuffled epoch"))
                dloader.close()
            if reader == "cudf":
                progress(f"{p.name}: loader, cudf reader")
                cloader = Loader(input_dir, transform_on="device", reader="cudf", **loader_args)
                seconds, _, wait, _ = measure_loader(cloader, step_factor)
                note = f"reader='cudf', end to end, shuffled epoch; data wait {100 * wait:.2f}%"
                rep.stages.append(Stage("cudf:loader", seconds, total, mbytes, note))
                cloader.close()
            progress(f"{p.name}: preprocess")
            warm = preprocess(p, shards, work / f"warm-{p.name}", workers=workers).transform_seconds
            shutil.rmtree(work / f"warm-{p.name}", ignore_errors=True)
            summary = preprocess(p, shards, work / f"ours-{p.name}", workers=workers)
            threaded = min(warm, summary.transform_seconds)
            rep.stages.append(Stage("preprocess", threaded, total, mbytes, "offline, to Parquet; best of two"))
            if client is not None:
                progress(f"{p.name}: preprocess on the cluster")
                secs = measure_cluster_preprocess(p, shards, work, client, work / f"ours-{p.name}")
                note = f"Dask, {len(client.scheduler_info()['workers'])} worker process(es); best of two; {secs / threaded:.2f}x the threaded time"
                rep.stages.append(Stage("preprocess:cluster", secs, total, mbytes, note))
            kind = _fitted_op(p)
            local = [s for s in shards if isinstance(s, Path)]
            progress(f"{p.name}: preprocess as a process")
            with_scripts = local if run_baselines and len(local) == len(shards) else None  # the baselines read local files
            secs, scripts = measure_processes(path, p.name, kind, input_dir, with_scripts, work, workers, work / f"ours-{p.name}")
            note = "etl preprocess, the whole process (start-up, fit, transform, write); best of two"
            for engine, (theirs, equal) in scripts.items():
                note += f"; the {engine} script's process takes {theirs / secs:.2f}x as long"
                rep.baselines[f"{engine}:process"] = {"seconds": theirs, "rows_per_second": total / theirs, "speedup_of_ours": theirs / secs,
                                                      "output_equal": equal, "versus": "etl preprocess process"}  # fmt: skip
            if with_scripts is not None and kind in EXACT and not duckdb_baselines.HAS_DUCKDB:
                note += "; " + NO_DUCKDB
            rep.stages.append(Stage("preprocess:process", secs, total, mbytes, note))
            progress(f"{p.name}: loader and stall")
            loader = Loader(input_dir, **loader_args)
            seconds, rep.data_wait_first_epoch, rep.data_wait, rep.wait_timeline = measure_loader(loader, step_factor)
            rep.stages.append(Stage("loader", seconds, total, mbytes, "end to end, shuffled epoch"))
            if model:
                rep.model_data_wait, _ = measure_stall(loader, 0.0, dlrm_step(loader))
            loader.close()
            if "dali" in engines:
                rep.stages.extend(measure_processed_loaders(p, shards, work, workers, batch_size, device, step_factor, progress))
            if run_baselines and kind and len(local) == len(shards):  # the baselines read local files
                for name, fn in BASELINES[kind].items():
                    progress(f"{p.name}: baseline {name}")
                    out = work / f"{name}-{p.name}"
                    secs = min(_timed(functools.partial(fn, local, out)) for _ in range(2))  # best of two, as ours
                    equal = baselines.same_output(out, work / f"ours-{p.name}") if name in EXACT[kind] else None
                    ours = sum(s.seconds for s in rep.stages if s.name in ("fit", "preprocess"))
                    rep.baselines[name] = {"seconds": secs, "rows_per_second": total / secs, "speedup_of_ours": secs / ours, "output_equal": equal,
                                           "versus": "fit + preprocess"}  # fmt: skip
                    if equal is False:
                        raise RuntimeError(f"the {name} baseline's output differs from ours for {path}")
        report.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)
