"""The ``etl`` command line. User errors (bad input, bad spec) exit 2 with one line naming file, row group/row and
column; no traceback."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import pyarrow.parquet as pq
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from etl.allocator import tune_allocator
from etl.errors import EtlError

if TYPE_CHECKING:
    from etl.pipeline import OnError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Streaming ETL for recommender training data.")
err = Console(stderr=True)
console = Console(soft_wrap=True)


@app.callback()
def _before_every_command() -> None:
    """Process-wide setup before any command runs: tune the allocator for batch processing (``etl.allocator``)."""
    tune_allocator()


# Write failures that are the environment's, not a bug: reported in one line naming the path.
_USER_ERRNOS = frozenset({errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT})


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the project's typed errors, and OSErrors of ``_USER_ERRNOS`` (disk full, permission denied,
    read-only file system, quota exceeded), into a one-line message and exit status 2."""
    try:
        yield
    except EtlError as e:
        _fail(str(e))
    except OSError as e:
        if e.errno not in _USER_ERRNOS:
            raise
        _fail(f"{e.filename}: {e.strerror}" if e.filename else f"{e.strerror or e}")


def _fail(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator:
    """A rows progress bar on stderr; yields ``advance(n)``."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal,
    ) as p:
        task = p.add_task(label, total=total)
        yield lambda n: p.advance(task, n)


def _total_rows(shards: list[Path]) -> int:
    total = 0
    for s in shards:
        try:
            total += pq.ParquetFile(s).metadata.num_rows
        except Exception:  # noqa: BLE001 - an unreadable file is reported by the reader with context
            return 0
    return total


@app.command()
def convert(
    inputs: list[Path] = typer.Argument(..., help="Delimited text files (optionally .gz)."),
    schema: Path = typer.Option(..., help="Schema YAML describing the columns and the text layout."),
    out: Path = typer.Option(..., help="Output directory for Parquet shards."),
    rows_per_file: int = typer.Option(1_000_000, help="Rows per output shard."),
    join: Path | None = typer.Option(None, help="A side table (delimited text with a header) left-joined onto every row on --on."),
    on: str | None = typer.Option(None, help="The join key: a schema column in the inputs and the side table."),
) -> None:
    """Convert delimited text (e.g. Criteo TSV) into Parquet shards in the raw layout."""
    from etl.errors import ConfigError
    from etl.io.join import SideTable
    from etl.io.text import convert as run
    from etl.schema import load_schema

    with user_errors():
        s = load_schema(schema)
        if (join is None) != (on is None):
            raise ConfigError("--join and --on go together: the side table and the key to join it on")
        side = SideTable.read(join, on, s) if join is not None and on is not None else None
        with progress_bar("convert", None) as advance:
            paths = run(list(inputs), s, out, rows_per_file=rows_per_file, progress=advance, side=side)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    console.print(f"wrote {len(paths)} shard(s), {rows:,} rows, to {out}")


schema_app = typer.Typer(no_args_is_help=True, help="Schemas: guess one from data.")
app.add_typer(schema_app, name="schema")


@schema_app.command("infer")
def schema_infer(
    inputs: list[Path] = typer.Argument(..., help="Delimited text (CSV/TSV, optionally .gz) or Parquet files of one layout."),
    out: Path | None = typer.Option(None, help="Write the schema here (default: print schema and pipeline)."),
    pipeline: Path | None = typer.Option(None, help="Write the starter pipeline here (needs --out: it names the schema file)."),
    rows: int = typer.Option(10_000, min=1, help="Rows read from the start of each input."),
) -> None:
    """Guess a schema and a starter pipeline from a sample; every guess is explained in a YAML comment."""
    import os

    from etl.infer import infer

    with user_errors():
        if pipeline is not None and out is None:
            raise EtlError("--pipeline needs --out: the pipeline names its schema file")
        guess = infer(list(inputs), rows=rows)
        if out is None:
            typer.echo(guess.schema_yaml() + "---\n" + guess.pipeline_yaml("schema.yaml"), nl=False)
            return
        out.write_text(guess.schema_yaml())
        if pipeline is None:
            typer.echo(guess.pipeline_yaml(os.path.relpath(out)), nl=False)
            return
        pipeline.write_text(guess.pipeline_yaml(os.path.relpath(out.resolve(), pipeline.resolve().parent)))
    console.print(f"wrote {out} ({len(guess.columns)} columns) and {pipeline}", highlight=False)


@app.command()
def generate(
    schema: Path = typer.Option(..., help="Schema YAML."),
    rows: int = typer.Option(..., help="Number of rows."),
    files: int = typer.Option(1, help="Number of shards."),
    out: Path = typer.Option(..., help="Output directory."),
    seed: int = typer.Option(0, help="Random seed (same seed → same bytes)."),
    max_cardinality: int | None = typer.Option(None, help="Largest categorical cardinality, whatever --rows (default: 30 × min(rows, 1 M))."),
) -> None:
    """Generate synthetic shards shaped like the schema's data (Zipf categoricals, nulls, heavy tails)."""
    from etl.schema import load_schema
    from etl.synth import generate as run

    with user_errors():
        s = load_schema(schema)
        with progress_bar("generate", rows) as advance:
            paths = run(s, rows, files, out, seed=seed, progress=advance, max_cardinality=max_cardinality)
    console.print(f"wrote {len(paths)} shard(s), {rows:,} rows, to {out}")


@app.command()
def fit(
    pipeline: Path = typer.Option(..., help="Pipeline YAML."),
    input: list[Path] = typer.Option(..., help="Raw Parquet shards or directories of them."),
    artifacts: Path = typer.Option(..., help="Directory to write the fitted artifacts to."),
    workers: int = typer.Option(2, help="Worker threads."),
    on_error: str = typer.Option("raise", help="raise | quarantine (skip invalid rows while fitting)."),
) -> None:
    """Fit the pipeline's statistics and vocabularies over all shards, in bounded memory."""
    import time

    from etl.io.parquet import list_shards
    from etl.pipeline import Pipeline

    with user_errors():
        _check_choice("--on-error", on_error, ("raise", "quarantine"))
        p = Pipeline.from_file(pipeline)
        shards = list_shards(list(input))
        t0 = time.perf_counter()
        with progress_bar("fit", _total_rows(shards)) as advance:
            p.fit(shards, workers=workers, on_error=cast("OnError", on_error), progress=advance)
        seconds = time.perf_counter() - t0
        p.save(artifacts)
    rows = _total_rows(shards)
    console.print(f"fitted {p.name} on {rows:,} rows in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} rows/s) → {artifacts}")
    _print_cardinalities(p.cardinalities())


@app.command()
def preprocess(
    pipeline: Path = typer.Option(..., help="Pipeline YAML."),
    input: list[Path] = typer.Option(..., help="Raw Parquet shards or directories of them."),
    out: Path = typer.Option(..., help="Output directory."),
    artifacts: Path | None = typer.Option(None, help="Fitted artifacts to use (fits first when omitted)."),
    workers: int = typer.Option(2, help="Worker threads."),
    on_error: str = typer.Option("raise", help="raise: stop at the first invalid value; quarantine: set invalid rows aside."),
    compression: str = typer.Option("none", help="Output Parquet compression: none | snappy | lz4 | zstd."),
) -> None:
    """Fit (when no artifacts are given) and transform every shard; resumable after an interruption."""
    from etl.io.parquet import list_shards
    from etl.pipeline import Pipeline
    from etl.preprocess import COMPRESSIONS, check_apart
    from etl.preprocess import preprocess as run

    with user_errors():
        _check_choice("--on-error", on_error, ("raise", "quarantine"))
        _check_choice("--compression", compression, COMPRESSIONS)
        p = Pipeline.from_file(pipeline)
        check_apart(out, list(input))
        shards = list_shards(list(input))
        total = _total_rows(shards)
        needs_fit = artifacts is None and not p.is_fitted
        with progress_bar("fit" if needs_fit else "transform", total) as advance:
            mode = cast("OnError", on_error)
            summary = run(p, shards, out, artifacts=artifacts, workers=workers, on_error=mode, compression=compression, progress=advance)
    c = console
    c.print(f"files: {summary.files} ({summary.files_skipped} already complete, skipped)")
    c.print(f"rows: {summary.rows_in:,} in = {summary.rows_out:,} out + {summary.rows_quarantined:,} quarantined")
    if summary.fit_seconds:
        c.print(f"fit: {summary.fit_seconds:.2f} s")
    c.print(f"transform: {summary.rows_processed:,} rows in {summary.transform_seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)")
    c.print(f"output: {out}")


@app.command()
def demo(
    pipeline: Path | None = typer.Option(None, help="Pipeline YAML; its schema shapes the data (default: etl's criteo.yaml)."),
    rows: int = typer.Option(1_000_000, help="Synthetic rows to generate."),
    files: int = typer.Option(4, help="Number of shards."),
    workdir: Path = typer.Option(Path("demo"), help="Where raw/ and processed/ are written."),
    workers: int = typer.Option(2, help="Worker threads."),
) -> None:
    """The main job on an embedded default: generate synthetic shards, fit, preprocess, summarise."""
    from etl.io.parquet import list_shards
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess as run
    from etl.resources import resource_path
    from etl.synth import generate as gen

    with user_errors():
        p = Pipeline.from_file(pipeline or resource_path("pipelines", "criteo.yaml"))
        raw, processed = workdir / "raw", workdir / "processed"
        with progress_bar("generate", rows) as advance:
            gen(p.schema, rows, files, raw, seed=0, progress=advance)
        console.print(f"generated {rows:,} synthetic {p.schema.name} rows in {files} shard(s) → {raw}")
        with progress_bar("preprocess", rows) as advance:
            summary = run(p, list_shards(raw), processed, workers=workers, progress=advance)
    console.print(f"fit: {summary.fit_seconds:.2f} s ({rows / max(summary.fit_seconds, 1e-9):,.0f} rows/s)")
    console.print(f"transform: {summary.rows_processed:,} rows in {summary.transform_seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)")
    console.print(f"rows: {summary.rows_in:,} in = {summary.rows_out:,} out + {summary.rows_quarantined:,} quarantined")
    _print_cardinalities(Pipeline.load(processed / "artifacts").cardinalities())
    console.print(f"processed shards, manifest and artifacts → {processed}  (see: etl inspect {processed})")


@app.command()
def bench(
    pipeline: list[Path] | None = typer.Option(None, help="Pipeline YAML (repeatable; default: the Criteo categorify and hash pipelines)."),
    input: Path | None = typer.Option(None, help="Raw shards to measure on (default: generate synthetic ones)."),
    rows: int = typer.Option(2_000_000, help="Synthetic rows to generate when no --input is given."),
    files: int = typer.Option(8, help="Synthetic shards to generate."),
    workers: int = typer.Option(2, help="Worker threads."),
    batch_size: int = typer.Option(65536, help="Loader batch size."),
    device: str = typer.Option("auto", help="Loader device: cpu, cuda, or auto (cuda when present)."),
    step_factor: float = typer.Option(1.25, help="Simulated training step, in multiples of the loader's time per batch."),
    model: bool = typer.Option(False, help="Also measure the data wait of a DLRM training on the batches (etl.bench.dlrm)."),
    baselines: bool = typer.Option(True, help="Run the naive polars and pyarrow+numpy baselines."),
    device_placement: bool | None = typer.Option(
        None, help="Also measure transform_on='device' (stages on the device, loader, stall); default: when the device is CUDA."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON."),
    plot_out: Path | None = typer.Option(None, "--plot", help="Write a PNG chart of the stages and the stall timeline."),
) -> None:
    """Measure read floor, every stage, fit, preprocess, the loader, data wait and baselines in one run."""
    import torch

    from etl.bench.report import plot
    from etl.bench.run import run_bench
    from etl.resources import resource_path

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    with user_errors(), err.status("benchmark") as status:
        pipelines = pipeline or [resource_path("pipelines", "criteo.yaml"), resource_path("pipelines", "criteo_hash.yaml")]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EtlError(f"--device {device}: torch {torch.__version__} sees no CUDA device")
        report = run_bench(pipelines, input_dir=input, rows=rows, files=files, workers=workers, batch_size=batch_size,
                           device=device, step_factor=step_factor, model=model, run_baselines=baselines,
                           device_placement=device_placement, progress=lambda msg: status.update(msg))  # fmt: skip
    _print_report(report)
    if json_out:
        json_out.write_text(report.to_json())
    if plot_out:
        plot(report, plot_out)


def _print_report(report) -> None:
    from rich.table import Table

    console.print(f"{report.rows:,} rows in {report.files} shard(s), {report.input_mbytes:,.1f} MB of Parquet; "
                  f"workers {report.workers}, batch {report.batch_size:,}, device {report.device}")  # fmt: skip
    for rep in report.pipelines:
        t = Table(title=rep.pipeline)
        for col in ("stage", "seconds", "rows/s", "MB/s", "note"):
            t.add_column(col, justify="left" if col in ("stage", "note") else "right")
        for s in rep.stages:
            mbs = f"{s.mbytes / s.seconds:,.0f}" if s.mbytes and s.seconds else ""
            t.add_row(s.name, f"{s.seconds:.3f}", f"{s.rows_per_second:,.0f}", mbs, s.note)
        console.print(t)
        console.print(f"data wait with the simulated step: {100 * rep.data_wait:.2f} % (first epoch {100 * rep.data_wait_first_epoch:.2f} %)"
                      + (f"; with the DLRM step: {100 * rep.model_data_wait:.2f} %" if rep.model_data_wait is not None else "")
                      + (f"; device placement: {100 * rep.device_data_wait:.2f} %" if rep.device_data_wait is not None else ""))  # fmt: skip
        for name, b in rep.baselines.items():
            eq = {True: "output equal", False: "OUTPUT DIFFERS", None: "other hash, same work"}[b["output_equal"]]
            speedup = b["speedup_of_ours"]
            console.print(f"baseline {name}: {b['rows_per_second']:,.0f} rows/s; ours (fit + preprocess) is {speedup:.2f}x faster ({eq})")
    console.print(f"peak memory: {report.peak_rss_mb:,.0f} MB")


@app.command()
def inspect(path: Path = typer.Argument(..., help="A raw or processed shard directory/file, or an artifacts directory.")) -> None:
    """Show the schema, row counts and vocabulary sizes of a raw, processed or artifacts directory."""
    from etl.inspect import describe

    with user_errors():
        text = describe(path)
    console.print(text, highlight=False)


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise EtlError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def _print_cardinalities(cards: dict[str, int]) -> None:
    if cards:
        console.print("cardinalities: " + ", ".join(f"{k}={v:,}" for k, v in cards.items()), highlight=False)
