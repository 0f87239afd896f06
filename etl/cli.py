"""The ``etl`` command line. User errors (bad input, bad spec, a bad option value) exit 2 with one line on stderr
naming file, row group/row and column, or the option; no traceback.

``-h`` and ``--help`` work on every command. An option that takes several paths takes them after one flag
(``--input a.parquet b.parquet``, as well as ``--input a.parquet --input b.parquet``), and every path argument
may be a glob pattern, quoted so that the shell leaves it alone (``--input 'data/*.parquet'``; see
``etl.io.paths``). Data paths (inputs, outputs, artifacts) may also be object-storage URLs such as
``s3://bucket/raw`` (``etl.io.fs``; credentials and endpoint from the environment, e.g. ``AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import errno
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from etl.errors import ConfigError, EtlError, InputError
from etl.io.fs import Location, location
from etl.io.paths import expand_globs
from etl.runtime.allocator import tune_allocator
from etl.runtime.startup import prepare

if TYPE_CHECKING:
    from etl.pipeline import OnError
    from etl.runtime.progress import Progress as PassProgress


class _Group(TyperGroup):
    """The ``etl`` command group: a usage error (unknown option, missing option, an option value of the wrong type
    or out of range) is one line on stderr, exit status 2, like every other user error."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:  # fmt: skip
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or not argv:  # no arguments: the help
            return super().main(argv, prog_name, complete_var, standalone_mode, windows_expand_args, **extra)
        try:
            code = super().main(argv, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.Abort:
            err.print("aborted", highlight=False)
            sys.exit(1)
        except typer.TyperException as e:  # usage errors of the command-line parser
            where = getattr(e, "ctx", None)
            _print_error(e.format_message() + (f" (see: {where.command_path} -h)" if where is not None else ""))
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


class _SeveralValues(TyperCommand):
    """A command whose options of several values take them all after one flag: ``--input a b`` is ``--input a
    --input b``. The values run up to the next argument that starts with ``-``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        flags = {o for p in self.params if getattr(p, "multiple", False) for o in p.opts}
        return super().parse_args(ctx, spread_values(args, flags))


def spread_values(args: list[str], flags: set[str]) -> list[str]:
    """``args`` with the flag repeated before every further value that follows a flag of ``flags`` (``--input a b``
    → ``--input a --input b``; ``--input=a b`` → ``--input=a --input b``). Nothing changes after ``--``."""
    out: list[str] = []
    flag: str | None = None
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        if a.startswith("-") and a != "-":
            name = a.split("=", 1)[0]
            flag = name if name in flags else None
            out.append(a)
        elif flag is not None and out[-1] != flag:
            out += [flag, a]
        else:
            out.append(a)
    return out


# rich_markup_mode=None: click's plain help, wrapped at the terminal width (80 columns at most) without cutting a
# word short, and text such as "pip install 'etl[dali]'" shown as written (rich would read [dali] as markup)
app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, rich_markup_mode=None, help="Streaming ETL for recommender training data.",
                  context_settings={"help_option_names": ["-h", "--help"]})  # fmt: skip
err = Console(stderr=True)
console = Console(soft_wrap=True)

#: help text of the options that take several paths
SEVERAL = "several values or glob patterns: --input a.parquet b.parquet, --input 'raw/*.parquet'"
#: help text of --schema and --pipeline
OR_SHIPPED = ", or the name of one that ships with etl (see etl list)"
#: help text of --cluster
CLUSTER = ("Run on Dask: local:N (N worker processes here) or a scheduler address such as tcp://HOST:PORT "
           "(default: $DASK_SCHEDULER_ADDRESS when set, else --workers threads).")  # fmt: skip
#: help text of --partitions
PARTITIONS = "With --cluster: partitions of each count table (default: one per 2**22 estimated distinct keys)."


def _show_version(show: bool) -> None:
    if show:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"etl {version('etl')}", highlight=False)
        except PackageNotFoundError:
            console.print("etl (not installed: no package metadata)", highlight=False)
        raise typer.Exit()


@app.callback()
def _before_every_command(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version, help="Show the version and exit."),
) -> None:
    """Process-wide setup before any command runs: tune the allocator for batch processing (``etl.runtime.allocator``)."""
    tune_allocator()


def main() -> None:
    """The ``etl`` program (``etl ...``, ``python -m etl ...``): prepare this process for the command its command line
    names (``etl.runtime.startup``), then run it."""
    prepare(next((a for a in sys.argv[1:] if not a.startswith("-")), None))
    app()


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


@contextmanager
def interruptible(kept: Callable[[], str], again: str) -> Iterator[None]:
    """Ctrl-C (KeyboardInterrupt) inside: one line on stderr saying what is kept (``kept()``) and, after ``again``
    (how a rerun goes on), the command as typed; then exit status 130 (128 + SIGINT), as a shell reports it."""
    try:
        yield
    except KeyboardInterrupt:
        err.print(f"interrupted: {kept()}; {again}: etl {shlex.join(sys.argv[1:])}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


def _fail(message: str) -> NoReturn:
    _print_error(message)
    raise typer.Exit(2) from None


def _print_error(message: str) -> None:
    """``error: message``, on one line of stderr (``message`` is shown as is, never read as markup)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


@contextmanager
def progress_bars(total: int | None) -> Iterator[PassProgress]:
    """Row progress bars on stderr, one per pass (``etl.runtime.progress``); yields ``report(pass_name, rows)``. A pass's
    bar, labelled with its name, appears with its first report (the bar of the pass before goes) and counts up to
    ``total`` rows (unknown when None). When stderr is not a terminal, nothing is shown (and rich's progress
    display is not even loaded)."""
    if not err.is_terminal:
        yield lambda name, rows: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    lock = threading.Lock()
    tasks: dict[str, TaskID] = {}
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
    ) as p:

        def report(name: str, rows: int) -> None:
            with lock:
                if name not in tasks:
                    for task in tasks.values():
                        p.update(task, visible=False)
                    tasks[name] = p.add_task(name, total=total)
                p.advance(tasks[name], rows)

        yield report


def _total_rows(shards: list[Location]) -> int:
    from etl.io.parquet import read_footer

    total = 0
    for s in shards:
        try:
            total += read_footer(s).num_rows
        except Exception:  # noqa: BLE001 - an unreadable file is reported by the reader with context
            return 0
    return total


@app.command(short_help="Convert delimited text (CSV/TSV, .gz) into raw Parquet shards.")
def convert(
    inputs: list[str] = typer.Argument(..., help="Delimited text files (optionally .gz); glob patterns are expanded."),
    schema: Path = typer.Option(..., help=f"Schema YAML describing the columns and the text layout{OR_SHIPPED}."),
    out: str = typer.Option(..., help="Output directory for Parquet shards."),
    rows_per_file: int = typer.Option(1_000_000, min=1, help="Rows per output shard."),
    join: Path | None = typer.Option(None, help="A side table (delimited text with a header) left-joined onto every row on --on."),
    on: str | None = typer.Option(None, help="The join key: a schema column in the inputs and the side table."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the shards --out holds (they are removed once the new ones are written)."),
    append: bool = typer.Option(False, "--append", help="Add the new shards after those --out holds, their numbers continuing (same schema)."),
) -> None:
    """Convert delimited text (e.g. Criteo TSV) into Parquet shards in the raw layout. An --out that holds shards
    already is refused unless --overwrite (replace them) or --append (add the new ones after them: a new day of
    data) is given."""
    from etl.errors import ConfigError
    from etl.io.join import SideTable
    from etl.io.parquet import read_footer
    from etl.io.text import convert as run
    from etl.io.text import existing_shards
    from etl.schema import load_schema

    nothing = f"nothing written to {out} (convert renames its shards into place once all are written)"
    with interruptible(lambda: nothing, "the same command starts again"), user_errors():
        s = load_schema(schema)
        if (join is None) != (on is None):
            raise ConfigError("--join and --on go together: the side table and the key to join it on")
        if overwrite and append:
            raise ConfigError("--overwrite replaces the shards --out holds, --append keeps them: give one of them")
        held = existing_shards(location(out))
        if held and not (overwrite or append):
            raise ConfigError(f"{out}: holds {len(held)} shard(s) already ({held[0].name} .. {held[-1].name}); --overwrite replaces "
                              "them, --append adds the new shards after them")  # fmt: skip
        side = SideTable.read(join, on, s) if join is not None and on is not None else None
        files = expand_globs(inputs)
        with progress_bars(None) as report:
            paths = run(files, s, location(out), rows_per_file=rows_per_file, progress=partial(report, "convert"), side=side, append=append)
        rows = sum(read_footer(p).num_rows for p in paths)
    after = f" after the {len(held)} it held" if append and held else ""
    console.print(f"wrote {len(paths)} shard(s), {rows:,} rows, to {out}{after}")


schema_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Schemas: guess one from data.")
app.add_typer(schema_app, name="schema")


@schema_app.command("infer", short_help="Guess a schema and a starter pipeline from a sample.")
def schema_infer(
    inputs: list[Path] = typer.Argument(..., help="Delimited text (CSV/TSV, optionally .gz) or Parquet files of one layout."),
    out: Path | None = typer.Option(None, help="Write the schema here (default: print schema and pipeline)."),
    pipeline: Path | None = typer.Option(None, help="Write the starter pipeline here (needs --out: it names the schema file)."),
    rows: int = typer.Option(10_000, min=1, help="Rows read from the start of each input."),
) -> None:
    """Guess a schema and a starter pipeline from a sample; every guess is explained in a YAML comment."""
    import os

    from etl.tools.infer import infer

    with user_errors():
        if pipeline is not None and out is None:
            raise EtlError("--pipeline needs --out: the pipeline names its schema file")
        guess = infer(cast("list[Path]", expand_globs(inputs)), rows=rows)
        if out is None:
            typer.echo(guess.schema_yaml() + "---\n" + guess.pipeline_yaml("schema.yaml"), nl=False)
            return
        out.write_text(guess.schema_yaml())
        if pipeline is None:
            typer.echo(guess.pipeline_yaml(os.path.relpath(out)), nl=False)
            return
        pipeline.write_text(guess.pipeline_yaml(os.path.relpath(out.resolve(), pipeline.resolve().parent)))
    console.print(f"wrote {out} ({len(guess.columns)} columns) and {pipeline}", highlight=False)


@app.command(short_help="Generate synthetic raw shards shaped like a schema's data.")
def generate(
    schema: Path = typer.Option(..., help=f"Schema YAML{OR_SHIPPED}."),
    rows: int = typer.Option(..., min=1, help="Number of rows."),
    files: int = typer.Option(1, min=1, help="Number of shards."),
    out: str = typer.Option(..., help="Output directory."),
    seed: int = typer.Option(0, help="Random seed (same seed → same bytes)."),
    max_cardinality: int | None = typer.Option(
        None, min=1, help="Largest categorical cardinality, whatever --rows (default: 30 × min(rows, 1 M))."
    ),
) -> None:
    """Generate synthetic shards shaped like the schema's data (Zipf categoricals, nulls, heavy tails); a schema with
    generate.events gets a stream of behaviour events (users in sessions, Zipf items, ties, late events)."""
    from etl.schema import load_schema
    from etl.tools.synth import generate as run

    with user_errors():
        s = load_schema(schema)
        with progress_bars(rows) as report:
            paths = run(s, rows, files, location(out), seed=seed, progress=partial(report, "generate"), max_cardinality=max_cardinality)
    console.print(f"wrote {len(paths)} shard(s), {rows:,} rows, to {out}")


@app.command(cls=_SeveralValues, short_help="Fit a pipeline's statistics and vocabularies over raw shards.")
def fit(
    pipeline: Path = typer.Option(..., help=f"Pipeline YAML{OR_SHIPPED}."),
    input: list[str] = typer.Option(..., metavar="PATHS", help=f"Raw Parquet shards or directories of them ({SEVERAL})."),
    artifacts: str = typer.Option(..., help="Directory to write the fitted artifacts to."),
    workers: int = typer.Option(2, min=1, help="Worker threads (without --cluster)."),
    on_error: str = typer.Option("raise", help="raise | quarantine (skip invalid rows while fitting)."),
    cluster: str | None = typer.Option(None, help=CLUSTER),
    partitions: int | None = typer.Option(None, min=1, max=2**31, help=PARTITIONS),
) -> None:
    """Fit the pipeline's statistics and vocabularies over all shards, in bounded memory. With --cluster, count tables
    are spilled to a temporary directory inside --artifacts (on a cluster of several machines, storage every worker
    sees: a shared file system or object storage), removed at the end (or by the next fit into --artifacts, after an
    interrupted one)."""
    import time

    from etl.io.files import check_no_linked_directories, remove_temporaries
    from etl.io.parquet import list_shards
    from etl.pipeline import Pipeline
    from etl.runtime.cluster import connect

    nothing = f"nothing saved to {artifacts} (a fit saves its artifacts when it ends)"
    with interruptible(lambda: nothing, "the same command fits again"), user_errors():
        _check_choice("--on-error", on_error, ("raise", "quarantine"))
        p = Pipeline.from_file(pipeline)
        shards = list_shards(_parquet_inputs(expand_globs(input), p))
        art = location(artifacts)
        check_no_linked_directories(art)  # before the fit, not when it saves
        with connect(cluster) as client:
            workdir = art if client is not None else None  # the spill files
            if workdir is not None:
                workdir.mkdir(parents=True, exist_ok=True)
                remove_temporaries(workdir)  # the work directory of an interrupted fit
            t0 = time.perf_counter()
            with progress_bars(_total_rows(shards)) as report:
                mode = cast("OnError", on_error)
                p.fit(shards, workers=workers, on_error=mode, progress=report, client=client, partitions=partitions, workdir=workdir)
            seconds = time.perf_counter() - t0
        p.save(art)
    rows = _total_rows(shards)
    console.print(f"fitted {p.name} on {rows:,} rows in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} rows/s) → {artifacts}")
    _print_cardinalities(p.cardinalities())
    _print_warnings(p.fit_warnings)


@app.command(cls=_SeveralValues, short_help="Fit and transform raw shards into processed shards.")
def preprocess(
    pipeline: Path = typer.Option(..., help=f"Pipeline YAML{OR_SHIPPED}."),
    input: list[str] = typer.Option(..., metavar="PATHS", help=f"Raw Parquet shards or directories of them ({SEVERAL})."),
    out: str = typer.Option(..., help="Output directory."),
    artifacts: str | None = typer.Option(None, help="Fitted artifacts to use (fits first when omitted)."),
    workers: int = typer.Option(2, min=1, help="Worker threads (without --cluster)."),
    on_error: str = typer.Option("raise", help="raise: stop at the first invalid value; quarantine: set invalid rows aside."),
    compression: str = typer.Option("none", help="Output Parquet compression: none | snappy | lz4 | zstd."),
    format: str = typer.Option("parquet", "--format", help="Output formats: parquet | npy | parquet,npy (npy: fixed-width .npy chunks "
                               "that DALI's numpy reader takes; no list columns)."),  # fmt: skip
    npy_chunk_rows: int = typer.Option(65536, min=1, help="Rows per .npy chunk (--format npy)."),
    cluster: str | None = typer.Option(None, help=CLUSTER),
    partitions: int | None = typer.Option(None, min=1, max=2**31, help=PARTITIONS),
    memory_budget: str | None = typer.Option(
        None,
        help="Bytes the single pass may hold in memory between fit and transform, e.g. 512M or 2G (default: 64M; keyed steps: a "
        "quarter of the machine's memory); beyond it, row groups wait in a temporary directory inside --out.",
    ),
    follow: bool = typer.Option(
        False,
        help="Follow one input directory: transform each shard as it arrives (in the --arrivals order), "
        "appending to --out, until Ctrl-C / SIGTERM or --stop-after-idle. Needs --artifacts or a pipeline with nothing to fit.",
    ),
    poll_interval: float = typer.Option(1.0, min=0.001, help="With --follow: seconds between listings of the input directory."),
    stop_after_idle: float | None = typer.Option(None, min=0, help="With --follow: stop once no shard has arrived for this many seconds."),
    arrivals: str = typer.Option("names", help="With --follow: the arrival order. names: name order, each shard once renamed onto its "
                                 ".parquet name; manifest: the order the producer lists them in _arrivals.json (etl.io.arrivals_manifest)."),
    training: bool | None = typer.Option(
        None,
        "--training/--no-training",
        help="Transform the rows as training rows, the rows the statistics were fitted on: TargetEncode gives them out-of-fold "
        "values. Default: --training when this run fits (no --artifacts), --no-training with --artifacts (validation, test, new "
        "rows: the full statistics).",
    ),
    split: str | None = typer.Option(None, help="Write --out/train, --out/valid and --out/test, fitting every statistic on the train rows "
                                     "only; overrides the pipeline's split: section. YAML flow text, e.g. '{by: time, column: timestamp, "
                                     "train_until: 889000000, valid_until: 891000000}', or the path of a YAML file holding it "
                                     "(see pipelines/README.md#split)."),
) -> None:
    """Fit (when no artifacts are given) and transform every shard, reading each shard once (the fit keeps what the
    transform needs, see --memory-budget); resumable after an interruption. With --cluster, both run on the
    cluster's workers (the fit's count tables spilled inside --out), and each shard is read by both. With --follow,
    keep transforming the shards a producer adds to the input directory (etl.preprocess.follow). With a split
    (--split, or the pipeline's split: section), each split is written apart (etl.preprocess.split)."""
    if follow:
        with user_errors():
            if split is not None:
                raise ConfigError("--follow transforms shards as they arrive with fitted artifacts: it takes no --split")
            if memory_budget is not None or partitions is not None:
                raise ConfigError("--follow fits nothing: it takes no --memory-budget nor --partitions")
            if format != "parquet" or npy_chunk_rows != 65536:
                raise ConfigError("--follow writes Parquet files: it takes no --format nor --npy-chunk-rows")
            if training:
                raise ConfigError("--follow transforms rows that arrive after the fit: it takes no --training")
        _preprocess_follow(pipeline, input, out, artifacts, workers, on_error, compression, cluster, poll_interval, stop_after_idle, arrivals)
        return
    if poll_interval != 1.0 or stop_after_idle is not None or arrivals != "names":
        with user_errors():
            raise ConfigError("--poll-interval, --stop-after-idle and --arrivals go with --follow")
    from etl.runtime.cluster import connecting

    shards: list[Location] = []
    split_given: str | dict[str, Any] | None = None
    kept = lambda: _written_by_preprocess(location(out), len(shards), split_given is not None)  # noqa: E731 - read when interrupted
    # a local cluster starts in the background while the pipeline is imported and read (or loaded from --artifacts)
    # and the shards listed
    with interruptible(kept, "the same command resumes"), user_errors(), connecting(cluster) as client:
        from etl.io.parquet import list_shards
        from etl.io.processed import describe_rows
        from etl.pipeline import Pipeline, check_match
        from etl.preprocess import COMPRESSIONS, check_apart, parse_formats
        from etl.preprocess import preprocess as run

        _check_choice("--on-error", on_error, ("raise", "quarantine"))
        _check_choice("--compression", compression, COMPRESSIONS)
        try:
            formats = parse_formats(format)
        except ValueError as e:
            raise EtlError(f"--format: {e}") from None
        p = Pipeline.from_file(pipeline)
        inputs, out_dir = _parquet_inputs(expand_globs(input), p), location(out)
        check_apart(out_dir, inputs)
        shards = list_shards(inputs)
        # --split, else the pipeline file's split (handed over as such: with --artifacts the run refuses it)
        split_given = split if split is not None else p.doc.get("split")
        if artifacts is not None:  # the fitted pipeline, handed to the run as such (nothing left to fit)
            saved = location(artifacts)
            p, spec = Pipeline.load(saved), p
            check_match(p, spec, saved)
        with progress_bars(_total_rows(shards)) as report:
            mode = cast("OnError", on_error)
            summary = run(p, shards, out_dir, workers=workers, on_error=mode, compression=compression, progress=report, client=client(),
                          partitions=partitions, memory_budget=memory_budget, formats=formats, npy_chunk_rows=npy_chunk_rows,
                          training=training, split=split_given)  # fmt: skip
    if summary.splits:
        _print_split_summary(summary, out)
        return
    c = console
    c.print(f"files: {summary.files}" + (f" ({summary.files_skipped} already complete, skipped)" if summary.files_skipped else ""))
    c.print("rows: " + describe_rows(summary.rows_in, summary.rows_out, summary.rows_quarantined, summary.stages))
    if summary.fit_seconds is not None:
        c.print(f"fit: {summary.fit_seconds:.2f} s")
    if summary.stash_peak_bytes or summary.stash_spilled_bytes:
        peak, budget, spilled = (_mib(n) for n in (summary.stash_peak_bytes, summary.memory_budget, summary.stash_spilled_bytes))
        c.print(f"stash: peak {peak} in memory (budget {budget}), {spilled} on disk")
    if summary.files_skipped < summary.files:
        c.print(f"transform: {summary.rows_processed:,} rows in {summary.transform_seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)")
    _print_warnings(summary.warnings)
    c.print(f"output: {out}")


def _written_by_preprocess(out: Location, shards: int, split: bool) -> str:
    """What an interrupted ``etl preprocess`` into ``out`` has written, as its manifests list it (of each split's
    directory with a split): "N of M shards written to OUT" (M: ``shards``, unknown while 0)."""
    from etl.io.processed import read_manifest

    done = 0
    for directory in [out / role for role in ("train", "valid", "test")] if split else [out]:
        try:
            done += len(read_manifest(directory).files)
        except EtlError:  # no manifest yet, or one that the rerun will judge
            continue
    if split:
        return f"{done} shard outputs written to {out}/train, valid and test"
    return f"{done} of {shards or '?'} shards written to {out}"


def _print_split_summary(summary: Any, out: str) -> None:
    """The summary of a split run (``etl.preprocess.split``): per split, its rule, rows, row accounting and the
    values train never saw; then the fit and transform times."""
    from etl.io.processed import describe_rows

    c = console
    c.print(f"files: {summary.files}   rows read: {summary.rows_in:,}")
    for part in summary.splits:
        s, r = part.summary, part.report
        skipped = f" ({s.files_skipped} already complete, skipped)" if s.files_skipped else ""
        c.print(f"{r.role}: {r.rows:,} rows ({r.rule}) → {part.directory}{skipped}")
        c.print("  rows: " + describe_rows(s.rows_in, s.rows_out, s.rows_quarantined, s.stages))
        if r.unseen:
            c.print("  never seen in train: " + ", ".join(f"{u.column} {u.rows:,} rows ({u.distinct:,} distinct)" for u in r.unseen))
    if summary.fit_seconds is not None:
        c.print(f"fit (train rows): {summary.fit_seconds:.2f} s")
    c.print(f"transform: {summary.rows_processed:,} rows into {len(summary.splits)} splits in {summary.transform_seconds:.2f} s "
            f"({summary.rows_per_second:,.0f} rows/s)")
    _print_warnings(summary.warnings)
    c.print(f"output: {out}")


def _preprocess_follow(pipeline: Path, inputs: list[str], out: str, artifacts: str | None, workers: int, on_error: str, compression: str,
                       cluster: str | None, poll_interval: float, stop_after_idle: float | None, arrivals: str) -> None:  # fmt: skip
    """``etl preprocess --follow``: SIGINT and SIGTERM stop the run cleanly (exit 0, the manifest listing what was
    committed)."""
    import signal

    with user_errors():
        from etl.io.arrivals import ORDERS
        from etl.io.processed import describe_rows
        from etl.pipeline import Pipeline, check_match
        from etl.preprocess import COMPRESSIONS
        from etl.preprocess.follow import preprocess_follow

        _check_choice("--on-error", on_error, ("raise", "quarantine"))
        _check_choice("--compression", compression, COMPRESSIONS)
        _check_choice("--arrivals", arrivals, ORDERS)
        if cluster is not None:
            raise ConfigError("--follow runs in threads: it takes no --cluster")
        if len(inputs) != 1:
            raise ConfigError(f"--follow follows one input directory, got {len(inputs)} inputs")
        directory = location(inputs[0])
        if not directory.is_dir():
            raise ConfigError(f"{directory}: --follow follows a directory of shards, and this is not one")
        p = Pipeline.from_file(pipeline)
        if artifacts is not None:
            saved = location(artifacts)
            p, spec = Pipeline.load(saved), p
            check_match(p, spec, saved)
        stop = threading.Event()
        handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            console.print(f"following {directory} → {out} (Ctrl-C stops)")
            summary = preprocess_follow(p, directory, location(out), stop=stop, poll_interval=poll_interval, stop_after_idle=stop_after_idle,
                                        workers=workers, on_error=cast("OnError", on_error), compression=compression,
                                        arrivals=arrivals)  # fmt: skip
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    t = summary.totals
    console.print(f"files: {summary.files} ({summary.files_kept} already complete, {summary.files_committed} transformed now)")
    console.print("rows: " + describe_rows(t.rows_in, t.rows_out, t.rows_quarantined, t.stages))
    _print_warnings(p.fit_warnings)
    console.print(f"output: {out}")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


@app.command(short_help="Generate, fit and preprocess a synthetic sample; show the next step.")
def demo(
    pipeline: Path | None = typer.Option(None, help=f"Pipeline YAML{OR_SHIPPED}; its schema shapes the data (default: criteo)."),
    rows: int = typer.Option(1_000_000, min=1, help="Synthetic rows to generate."),
    files: int = typer.Option(4, min=1, help="Number of shards."),
    workdir: Path = typer.Option(Path("demo"), help="Where raw/ and processed/ are written."),
    workers: int = typer.Option(2, min=1, help="Worker threads."),
) -> None:
    """The main job on an embedded default: generate synthetic shards, fit, preprocess, summarise."""
    from etl.io.parquet import list_shards
    from etl.io.processed import describe_rows
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess as run
    from etl.resources import resource_path
    from etl.tools.synth import generate as gen

    with user_errors():
        p = Pipeline.from_file(pipeline or resource_path("pipelines", "criteo.yaml"))
        raw, processed = workdir / "raw", workdir / "processed"
        with progress_bars(rows) as report:
            gen(p.schema, rows, files, raw, seed=0, progress=partial(report, "generate"))
        console.print(f"generated {rows:,} synthetic {p.schema.name} rows in {files} shard(s) → {raw}")
        with progress_bars(rows) as report:
            summary = run(p, list_shards(raw), processed, workers=workers, progress=report)
    if summary.fit_seconds is not None:
        console.print(f"fit: {summary.fit_seconds:.2f} s ({rows / max(summary.fit_seconds, 1e-9):,.0f} rows/s)")
    console.print(f"transform: {summary.rows_processed:,} rows in {summary.transform_seconds:.2f} s ({summary.rows_per_second:,.0f} rows/s)")
    console.print("rows: " + describe_rows(summary.rows_in, summary.rows_out, summary.rows_quarantined, summary.stages))
    _print_cardinalities(Pipeline.load(processed / "artifacts").cardinalities())
    console.print(f"processed shards, manifest and artifacts → {processed}  (see: etl inspect {processed})")
    console.print("next: train on them, e.g. with this loop (python):\n", highlight=False)
    console.print(training_loop(str(processed), summary.rows_out), highlight=False, markup=False)


def training_loop(processed: str, rows: int) -> str:
    """A small training loop, as Python source, over the processed output in ``processed``: embedding tables for
    the sparse columns (at most 2**20 rows each, hashed ids folded in), the dense columns beside them, one linear
    layer, binary cross-entropy on the label, in batches of up to 4096 of its ``rows`` rows (``etl demo`` prints it as
    the next step)."""
    return f"""import etl
import torch

loader = etl.Loader({processed!r}, batch_size={min(4096, rows)}, shuffle=True, seed=0)
sizes = loader.pipeline.cardinalities()
tables = torch.nn.ModuleList(torch.nn.Embedding(min(sizes[c], 2**20), 16) for c in loader.layout.sparse)
head = torch.nn.Linear(len(loader.layout.dense) + 16 * len(tables), 1)
opt = torch.optim.Adam([*tables.parameters(), *head.parameters()], lr=1e-3)
for batch in loader:  # batch.label [B], batch.dense [B, D], batch.sparse [B, S] ids
    ids = [t(batch.sparse[:, i].long() % t.num_embeddings) for i, t in enumerate(tables)]
    logits = head(torch.cat([batch.dense, *ids], 1)).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.label)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss on the last batch: {{loss.item():.4f}}")
"""


@app.command(cls=_SeveralValues, short_help="Measure every stage, the loader, data wait and baselines.")
def bench(
    pipeline: list[Path] | None = typer.Option(
        None, metavar="PATHS", help="Pipeline YAMLs or shipped names, several values or glob patterns (default: criteo and criteo_hash)."
    ),
    input: str | None = typer.Option(None, help="Raw shards to measure on (default: generate synthetic ones)."),
    rows: int | None = typer.Option(None, min=1, help="Synthetic rows to generate when no --input is given (default 2,000,000; "
                                    "--sequences: 1,000,000 events)."),  # fmt: skip
    files: int = typer.Option(8, min=1, help="Synthetic shards to generate."),
    workers: int = typer.Option(2, min=1, help="Worker threads."),
    batch_size: int = typer.Option(65536, min=1, help="Loader batch size."),
    device: str = typer.Option("auto", help="Loader device: cpu, cuda, or auto (cuda when present)."),
    step_factor: float = typer.Option(1.25, min=0.0, help="Simulated training step, in multiples of the loader's time per batch."),
    model: bool = typer.Option(False, help="Also measure the data wait of a DLRM training on the batches (etl.bench.dlrm)."),
    baselines: bool = typer.Option(True, help="Run the naive polars and pyarrow+numpy baselines."),
    device_placement: bool | None = typer.Option(
        None, help="Also measure transform_on='device' (stages on the device, loader, stall); default: when the device is CUDA."
    ),
    reader: str = typer.Option("cpu", help="cudf: also measure a loader whose row groups cudf decodes on the GPU (needs cudf and CUDA)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON."),
    plot_out: Path | None = typer.Option(None, "--plot", help="Write a PNG chart of the stages and the stall timeline."),
    cluster: str | None = typer.Option(
        None, help="Also preprocess on Dask, beside the threaded figures: local:N or a scheduler address (default: $DASK_SCHEDULER_ADDRESS)."
    ),
    engine: list[str] = typer.Option([], help="Also measure the loader on a preprocessed output with this engine beside the default "
                                     "one: dali (needs pip install 'etl[dali]')."),  # fmt: skip
    follow: bool = typer.Option(False, "--follow", help="Instead: the freshness of a following loader fed by a producer of shards "
                                "(etl.bench.freshness; fit-free pipelines, default criteo_hash)."),  # fmt: skip
    rate: float = typer.Option(1.0, min=0.0, help="--follow: shards the producer writes per second."),
    shard_rows: int = typer.Option(131_072, min=1, help="--follow: rows per shard."),
    duration: float = typer.Option(20.0, min=0.0, help="--follow: seconds the producer writes for (one shard at start, then rate per second)."),
    poll_interval: float = typer.Option(0.5, min=0.0, help="--follow: the loader's poll interval and idle flush, seconds."),
    arrivals: str = typer.Option("names", help="--follow: the arrival order: names, or manifest (the producer lists its shards in "
                                 "_arrivals.json)."),  # fmt: skip
    sequences: bool = typer.Option(False, "--sequences", help="Instead: History and Groupby on synthetic events (schemas/events.yaml; "
                                   "--rows events, default 1,000,000), offline and streaming, beside polars and DuckDB scripts "
                                   "(etl.bench.sequences)."),  # fmt: skip
    repeat: int = typer.Option(3, min=1, help="--sequences, --processes: runs per figure (the median is reported)."),
    processes: bool = typer.Option(False, "--processes", help="Instead: etl preprocess, the DuckDB and the polars scripts as whole "
                                   "processes side by side (wall, CPU s, peak RSS) at each of --sizes, and the fixed and per-row "
                                   "costs (etl.bench.processes)."),  # fmt: skip
    sizes: str = typer.Option("2000000,8000000", help="--processes: synthetic Criteo row counts, comma-separated (two or more for "
                              "the fixed and marginal costs)."),  # fmt: skip
    markdown: Path | None = typer.Option(None, help="--processes: also write the tables into this Markdown file (e.g. BENCHMARKS.md) "
                                         "in place of the block an earlier run wrote there (at its end the first time)."),  # fmt: skip
) -> None:
    """Measure read floor, every stage, fit, preprocess (also as a whole process), the loader, data wait and baselines
    in one run; with --follow, the lag, rows/s and stall of a following loader instead; with --sequences, History and
    Groupby on behaviour events."""
    import torch

    from etl.bench.report import plot
    from etl.bench.run import run_bench
    from etl.resources import resolve, resource_path
    from etl.runtime.cluster import connect

    if follow:
        from etl.bench.freshness import FreshnessSettings

        settings = FreshnessSettings(rate, shard_rows, duration, poll_interval, batch_size, workers, step_factor, arrivals=arrivals)
        _bench_follow(pipeline, settings, json_out)
        return
    if processes:
        _bench_processes(pipeline, sizes, workers, repeat, json_out, markdown)
        return
    if sequences:
        _bench_sequences(input, rows or 1_000_000, files, workers, batch_size, repeat, baselines, json_out)
        return
    rows = rows or 2_000_000
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    with user_errors(), err.status("benchmark") as status:
        defaults = [resource_path("pipelines", "criteo.yaml"), resource_path("pipelines", "criteo_hash.yaml")]
        pipelines = [resolve("pipelines", str(p)) for p in expand_globs(pipeline)] if pipeline else defaults
        try:
            torch.device(device)
        except RuntimeError:
            raise EtlError(f"--device {device!r}: not a device (cpu, cuda, cuda:N or auto)") from None
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EtlError(f"--device {device}: torch {torch.__version__} sees no CUDA device")
        for e in engine:
            _check_choice("--engine", e, ("dali",))
        input_dir = None if input is None else location(input)
        if reader not in ("cpu", "cudf"):
            raise EtlError(f"--reader {reader!r}: cpu or cudf")
        if reader == "cudf":
            from etl.loader import cudf_columns
            from etl.pipeline import Pipeline

            why = cudf_columns.unavailable(torch.device(device), Pipeline.from_file(pipelines[0]).schema)
            if why is not None:
                raise EtlError(f"--reader cudf: {why}")
        with connect(cluster) as client:
            report = run_bench(pipelines, input_dir=input_dir, rows=rows, files=files, workers=workers, batch_size=batch_size,
                               device=device, step_factor=step_factor, model=model, run_baselines=baselines,
                               device_placement=device_placement, reader=reader, progress=lambda msg: status.update(msg),
                               client=client, engines=tuple(engine))  # fmt: skip
    _print_report(report)
    if json_out:
        json_out.write_text(report.to_json())
    if plot_out:
        plot(report, plot_out)


def _bench_follow(pipeline: list[Path] | None, settings: Any, json_out: Path | None) -> None:
    """``etl bench --follow``: the freshness bench (``etl.bench.freshness``) of ``pipeline`` (default criteo_hash)."""
    from etl.bench.freshness import run_freshness_bench
    from etl.resources import resolve, resource_path

    with user_errors(), err.status("freshness benchmark") as status:
        settings.check()
        pipelines = [resolve("pipelines", str(p)) for p in expand_globs(pipeline)] if pipeline else [resource_path("pipelines", "criteo_hash.yaml")]
        report = run_freshness_bench(pipelines, settings, progress=lambda msg: status.update(msg))
    _print_report(report)
    if json_out:
        json_out.write_text(report.to_json())


def _bench_sequences(input: str | None, rows: int, files: int, workers: int, batch_size: int, repeat: int, baselines: bool,
                     json_out: Path | None) -> None:  # fmt: skip
    """``etl bench --sequences``: the sequence bench (``etl.bench.sequences``)."""
    from etl.bench.sequences import run_sequences_bench

    with user_errors(), err.status("sequence benchmark") as status:
        report = run_sequences_bench(input_dir=None if input is None else location(input), rows=rows, files=files, workers=workers,
                                     batch_size=batch_size, repeat=repeat, run_baselines=baselines,
                                     progress=lambda msg: status.update(msg))  # fmt: skip
    _print_report(report)
    if json_out:
        json_out.write_text(report.to_json())


def _bench_processes(pipeline: list[Path] | None, sizes: str, workers: int, repeat: int, json_out: Path | None, markdown: Path | None) -> None:
    """``etl bench --processes``: whole processes side by side (``etl.bench.processes``)."""
    from rich.table import Table

    from etl.bench.processes import against_duckdb, library_versions, markdown_span, run_process_bench, to_markdown, write_markdown
    from etl.resources import resolve, resource_path

    with user_errors(), err.status("process benchmark") as status:
        try:
            counts = [int(n.replace("_", "")) for n in sizes.split(",") if n.strip()]
        except ValueError:
            raise EtlError(f"--sizes {sizes!r}: row counts separated by commas, e.g. 2000000,8000000") from None
        if not counts or min(counts) < 1:
            raise EtlError(f"--sizes {sizes!r}: row counts >= 1")
        defaults = [resource_path("pipelines", "criteo.yaml"), resource_path("pipelines", "criteo_hash.yaml")]
        pipelines = [resolve("pipelines", str(p)) for p in expand_globs(pipeline)] if pipeline else defaults
        if markdown is not None:
            try:
                markdown_span(markdown)  # a file the tables cannot go into is refused before the runs, not after
            except ValueError as e:
                raise EtlError(str(e)) from None
        report = run_process_bench(pipelines, counts, workers=workers, repeat=repeat, progress=lambda msg: status.update(msg))
    console.print(f"whole processes, median of {report.repeat}; workers {report.workers}, {report.cores} core(s); "
                  "CPU = user + sys seconds, util = CPU / wall / cores")  # fmt: skip
    for rep in report.pipelines:
        t = Table(title=rep.pipeline)
        for col in ("rows", "process", "wall s", "CPU s", "util", "peak RSS MiB", "output"):
            t.add_column(col, justify="left" if col in ("process", "output") else "right")
        for f in rep.figures:
            eq = {True: "equal", False: "DIFFERS", None: "other hash"}[f.output_equal] if f.tool != "etl" else ""
            t.add_row(f"{f.rows:,}", f.tool, f"{f.wall:.2f}", f"{f.cpu:.2f}", f"{100 * f.cpu_utilisation:.0f} %", f"{f.peak_rss_mb:,.0f}", eq)
        console.print(t)
        if rep.lines:
            lines = Table(title="fixed (intercept) and marginal (per million rows) costs")
            for col in ("process", "wall s fixed", "wall s / M rows", "CPU s fixed", "CPU s / M rows", "RSS MiB fixed", "RSS MiB / M rows"):
                lines.add_column(col, justify="left" if col == "process" else "right")
            for tool, ln in rep.lines.items():
                lines.add_row(tool, *(f"{v:.2f}" for w in ("wall", "cpu") for v in (ln[w].fixed, ln[w].marginal)),
                              f"{ln['peak_rss_mb'].fixed:,.0f}", f"{ln['peak_rss_mb'].marginal:,.0f}")  # fmt: skip
            console.print(lines)
        for r in against_duckdb(rep):
            console.print(f"{r.rows:,} rows, ours / {r.tool}: wall {r.wall:.2f}, CPU {r.cpu:.2f}, peak RSS {r.peak_rss:.2f}")
        for tool, why in rep.skipped.items():
            console.print(f"{tool} skipped: {why}")
    if json_out:
        json_out.write_text(report.to_json())
    if markdown:
        command = shlex.join(["etl", "bench", "--processes", "--sizes", ",".join(map(str, report.sizes)), "--repeat", str(repeat),
                              "--workers", str(workers), *(a for p in pipeline or () for a in ("--pipeline", str(p)))])  # fmt: skip
        with user_errors():
            try:  # the file may have changed during the runs
                write_markdown(markdown, to_markdown(report, command, time.strftime("%Y-%m-%d", time.gmtime()), library_versions()))
            except ValueError as e:
                raise EtlError(str(e)) from None
        console.print(f"tables written into {markdown}")


def _print_report(report) -> None:
    from rich.table import Table

    from etl.bench.report import speed_ratio

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
        if rep.freshness is not None:
            f = rep.freshness
            console.print(f"freshness: {f.shards} shards of {f.shard_rows:,} rows at {f.rate:g}/s (arrivals: {f.arrivals}), poll "
                          f"{f.poll_interval:g} s, step {1000 * f.step_seconds:.1f} ms: lag p50 {1000 * f.lag_p50:.0f} ms, p99 "
                          f"{1000 * f.lag_p99:.0f} ms, max {1000 * f.lag_max:.0f} ms; must hold p99 < 2 x poll + shard transform = "
                          f"{1000 * f.bound:.0f} ms: {'holds' if f.holds else 'MISSED'}; stall {100 * rep.data_wait:.1f} % (waiting for the "
                          "producer included)")  # fmt: skip
            continue
        if any(s.name == "loader" for s in rep.stages):  # the sequence bench measures no stall
            console.print(f"data wait with the simulated step: {100 * rep.data_wait:.2f} % (first epoch {100 * rep.data_wait_first_epoch:.2f} %)"
                          + (f"; with the DLRM step: {100 * rep.model_data_wait:.2f} %" if rep.model_data_wait is not None else "")
                          + (f"; device placement: {100 * rep.device_data_wait:.2f} %" if rep.device_data_wait is not None else ""))  # fmt: skip
        for name, b in rep.baselines.items():
            eq = {True: "output equal", False: "OUTPUT DIFFERS", None: "other hash, same work"}[b["output_equal"]]
            speedup = b["speedup_of_ours"]
            cpu = f"; CPU {b['cpu_seconds']:.2f} s" if "cpu_seconds" in b else ""
            console.print(f"baseline {name}: {b['rows_per_second']:,.0f} rows/s{cpu}; ours ({b['versus']}) is {speed_ratio(speedup)} ({eq})")
    console.print(f"peak memory: {report.peak_rss_mb:,.0f} MB")


@app.command(short_help="Show the schema, rows and vocabularies of a directory.")
def inspect(path: str = typer.Argument(..., help="A raw or processed shard directory/file, or an artifacts directory.")) -> None:
    """Show the schema, row counts and vocabulary sizes of a raw, processed or artifacts directory."""
    from etl.tools.inspect import describe

    with user_errors():
        text = describe(location(path))
    console.print(text, highlight=False)


@app.command("list", short_help="List the schemas and pipelines that ship with etl.")
def list_shipped() -> None:
    """List the schemas and pipelines that ship with etl, each with one line on what it is. Name them anywhere a
    file is taken: --schema criteo, --pipeline criteo_hash, etl.Loader(..., pipeline="criteo"), or schema: criteo
    in a pipeline file."""
    from rich.table import Table

    from etl.resources import Kind, names, resource_path, summary

    shown: tuple[tuple[Kind, str], ...] = (("schemas", "--schema"), ("pipelines", "--pipeline"))
    for kind, flag in shown:
        table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        table.add_column(no_wrap=True)
        table.add_column()
        for name in names(kind):
            table.add_row(name, summary(kind, name))
        console.print(f"{kind} ({flag} NAME; files in {resource_path(kind, names(kind)[0] + '.yaml').parent}):", highlight=False)
        console.print(table, highlight=False, markup=False)
        console.print()


def _parquet_inputs(inputs: list[Location], pipeline: Any) -> list[Location]:
    """``inputs``, checked not to be delimited text (InputError with the ``etl convert`` command that makes shards of
    it, for the schema of ``pipeline``)."""
    from etl.io.text_hints import convert_hint
    from etl.resources import shipped_name

    schema = shipped_name("schemas", pipeline.schema.path) or pipeline.schema.path
    for path in inputs:
        hint = convert_hint(path, schema)
        if hint is not None:
            raise InputError(str(path), hint)
    return inputs


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise EtlError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def _print_warnings(warnings: Sequence[str]) -> None:
    """The fit's warnings (``Pipeline.fit_warnings``), one line each, in the summary."""
    for w in warnings:
        console.print(f"warning: {w}", highlight=False, markup=False)


def _print_cardinalities(cards: dict[str, int]) -> None:
    if cards:
        console.print("cardinalities: " + ", ".join(f"{k}={v:,}" for k, v in cards.items()), highlight=False)
