"""`etl bench --processes`: whole processes side by side, at several sizes.

For each pipeline (default ``criteo`` and ``criteo_hash``) and each size (synthetic Criteo rows, generated in shards
of ``SHARD_ROWS`` rows), ``repeat`` rounds each run, in turn, three whole processes on the same shards:

- ``etl``: ``etl preprocess`` (start-up, fit, transform, write), as a user runs it;
- ``duckdb``: the DuckDB SQL script of ``etl.bench.duckdb_baselines`` (skipped, with the reason, where duckdb is
  not importable); for Categorify also ``duckdb-joined``, its faster and larger variant;
- ``polars``: the polars script of ``etl.bench.polars_baselines``.

Each run's wall seconds, CPU seconds (user + system, of the process and the threads it ran) and peak resident set
size come from the kernel's accounting of that one process (``os.wait4`` in a small process between it and the
bench); its CPU utilisation is CPU seconds / wall
/ cores. A figure of a size is the median over the rounds. The outputs of the scripts must equal ours value for value
(``baselines.first_difference``), except the polars hash, whose hash is polars' own: RuntimeError otherwise.

Through the sizes, a straight line (least squares; through both points for two sizes) per tool and figure splits
the cost into a fixed part (the intercept: start-up, imports, what does not grow with the data) and a marginal part
(the slope, per million rows).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from etl.bench import baselines, duckdb_baselines
from etl.bench.run import _child_env, _fitted_op, preprocess_command
from etl.io.files import atomic_write_bytes
from etl.pipeline import Pipeline
from etl.tools.synth import generate

SHARD_ROWS = 250_000  # rows per generated shard: 2 M rows in 8 shards, 8 M in 32
MODULES = {"duckdb": "etl.bench.duckdb_baselines", "polars": "etl.bench.polars_baselines"}


@dataclass(frozen=True)
class ProcessRun:
    """One whole process: wall seconds, user and system CPU seconds, peak resident set size in MiB (the field keeps its JSON name)."""

    wall: float
    user: float
    sys: float
    peak_rss_mb: float

    @property
    def cpu(self) -> float:
        return self.user + self.sys


#: Runs ``argv[2:]`` as a child and writes ``[exit status, wall, user, sys, peak RSS KiB]`` of that child alone to the
#: file ``argv[1]``; a SIGTERM is passed on to it. A small process of its own between the bench and the measured one:
#: a forked child's peak RSS counts the pages of the process it was forked from, here a few MB instead of the bench's.
_ACCOUNTANT = """
import json, os, signal, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
_, status, ru = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump([os.waitstatus_to_exitcode(status), wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss], f)
"""


def run_process(command: list[str], out: Path) -> ProcessRun:
    """Run ``command``, a whole process writing into ``out`` (removed first), and account for it alone (wall
    seconds, and ``os.wait4`` of it for the CPU seconds and peak RSS). RuntimeError with the end of its stderr when
    it fails; an interrupt stops it."""
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="etl-bench-run-") as tmp:
        figures, errors = Path(tmp) / "rusage.json", Path(tmp) / "stderr"
        with errors.open("wb") as stderr:
            proc = subprocess.Popen([sys.executable, "-c", _ACCOUNTANT, str(figures), *command], stdout=subprocess.DEVNULL, stderr=stderr,
                                    env=_child_env())  # fmt: skip
            try:
                proc.wait()
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
        status, wall, user, system, maxrss = json.loads(figures.read_text()) if figures.exists() else (proc.returncode, 0, 0, 0, 0)
        if status != 0:
            tail = errors.read_bytes().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(command)} failed (exit status {status}): {tail}")
    return ProcessRun(wall, user, system, maxrss / 1024)  # ru_maxrss: KiB on Linux


@dataclass(frozen=True)
class Line:
    """``value ≈ fixed + marginal × millions of rows``."""

    fixed: float
    marginal: float


def fit_line(rows: Sequence[int], values: Sequence[float]) -> Line:
    """The least-squares line of ``values`` over ``rows`` (in millions): through both points for two sizes.
    ValueError unless there are as many values as sizes and at least two distinct sizes."""
    if len(rows) != len(values) or len(set(rows)) < 2:
        raise ValueError(f"a line needs values at two sizes or more, got sizes {list(rows)} and {len(values)} value(s)")
    slope, intercept = np.polyfit(np.asarray(rows, np.float64) / 1e6, np.asarray(values, np.float64), 1)
    return Line(float(intercept), float(slope))


@dataclass
class ToolFigures:
    """The medians over the rounds of one tool at one size; ``output_equal`` as ``etl bench``'s baselines (None:
    other ids by construction; ours: always True)."""

    tool: str
    rows: int
    wall: float
    cpu: float
    peak_rss_mb: float
    cpu_utilisation: float
    output_equal: bool | None
    runs: list[ProcessRun] = field(default_factory=list)


@dataclass
class PipelineProcesses:
    """One pipeline: figures per tool and size, the fixed and marginal lines per tool (``wall``, ``cpu``,
    ``peak_rss_mb``), the tools skipped with the reason."""

    pipeline: str
    figures: list[ToolFigures] = field(default_factory=list)
    lines: dict[str, dict[str, Line]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class ProcessReport:
    """One ``etl bench --processes`` run."""

    sizes: list[int]
    workers: int
    cores: int
    repeat: int
    pipelines: list[PipelineProcesses] = field(default_factory=list)

    def to_json(self) -> str:
        """The report as an indented JSON document (every run also carries its ``cpu``)."""
        doc = asdict(self)
        for p, rep in zip(doc["pipelines"], self.pipelines):
            for f, fig in zip(p["figures"], rep.figures):
                for r, run in zip(f["runs"], fig.runs):
                    r["cpu"] = run.cpu
        return json.dumps(doc, indent=1)


def _median_figures(tool: str, rows: int, runs: list[ProcessRun], cores: int, equal: bool | None) -> ToolFigures:
    wall = statistics.median(r.wall for r in runs)
    cpu = statistics.median(r.cpu for r in runs)
    return ToolFigures(tool, rows, wall, cpu, statistics.median(r.peak_rss_mb for r in runs), cpu / wall / cores, equal, runs)


def run_process_bench(
    pipelines: list[Path],
    sizes: Sequence[int],
    *,
    workers: int = 2,
    repeat: int = 3,
    progress: Callable[[str], None] = lambda msg: None,
) -> ProcessReport:
    """Measure as the module docstring says; temporary files live in a directory removed at the end."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if not sizes or any(n < 1 for n in sizes):
        raise ValueError(f"sizes must be row counts >= 1, got {list(sizes)}")
    sizes = sorted(set(sizes))
    cores = len(os.sched_getaffinity(0))
    report = ProcessReport(list(sizes), workers, cores, repeat)
    work = Path(tempfile.mkdtemp(prefix="etl-bench-proc-"))
    try:
        loaded = [Pipeline.from_file(p) for p in pipelines]
        report.pipelines = [PipelineProcesses(str(p)) for p in pipelines]
        for rows in sizes:
            raw = work / f"raw-{rows}"
            progress(f"generating {rows:,} synthetic rows")
            generate(loaded[0].schema, rows, max(1, math.ceil(rows / SHARD_ROWS)), raw, seed=0)
            shards = sorted(raw.glob("part-*.parquet"))
            for path, p, rep in zip(pipelines, loaded, report.pipelines):
                kind = _fitted_op(p).lower()
                tools = {"etl": preprocess_command(path, raw, work / "out-etl", workers)}
                for name, (module, script) in _scripts(kind).items():
                    if not kind:
                        rep.skipped[name] = f"no {name} script for {p.name} (one for a Categorify or Hash pipeline of Criteo)"
                    elif module == MODULES["duckdb"] and not duckdb_baselines.HAS_DUCKDB:
                        rep.skipped[name] = "duckdb is not importable (pip install 'etl[bench]')"
                    else:
                        tools[name] = [sys.executable, "-m", module, script, str(work / f"out-{name}"), *map(str, shards)]
                runs: dict[str, list[ProcessRun]] = {t: [] for t in tools}
                for k in range(repeat):  # rounds: the tools in turn, so that a busy spell hits them alike
                    for tool, command in tools.items():
                        progress(f"{p.name}, {rows:,} rows: {tool} (round {k + 1} of {repeat})")
                        runs[tool].append(run_process(command, work / f"out-{tool}"))
                for tool in tools:
                    equal = _compare(tool, kind, work / "out-etl", work / f"out-{tool}", p.name)
                    rep.figures.append(_median_figures(tool, rows, runs[tool], cores, equal))
        if len(sizes) > 1:
            for rep in report.pipelines:
                for tool in dict.fromkeys(f.tool for f in rep.figures):
                    figs = [f for f in rep.figures if f.tool == tool]
                    rows_of = [f.rows for f in figs]
                    rep.lines[tool] = {what: fit_line(rows_of, [getattr(f, what) for f in figs]) for what in ("wall", "cpu", "peak_rss_mb")}
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _scripts(kind: str) -> dict[str, tuple[str, str]]:
    """The scripts run beside ``etl preprocess`` for a pipeline whose fitted op is ``kind`` ("categorify", "hash"),
    by tool name: (module, script name). Categorify has two DuckDB scripts: ``duckdb`` (a join per file) and
    ``duckdb-joined`` (one join of every file: faster, more memory); the bench compares ours with both."""
    joined = {"duckdb-joined": (MODULES["duckdb"], "categorify-joined")} if kind == "categorify" else {}
    return {"duckdb": (MODULES["duckdb"], kind), **joined, "polars": (MODULES["polars"], kind)}


@dataclass(frozen=True)
class Ratio:
    """Ours over one DuckDB script (``tool``) at ``rows`` rows: wall, CPU seconds, peak RSS (below 1: ours is faster
    or smaller)."""

    rows: int
    tool: str
    wall: float
    cpu: float
    peak_rss: float


def against_duckdb(rep: PipelineProcesses) -> list[Ratio]:
    """Ours over each DuckDB script measured for ``rep`` (``duckdb``, ``duckdb-joined``), size by size."""
    tools = dict.fromkeys(f.tool for f in rep.figures if f.tool.startswith("duckdb"))
    out = []
    for ours in (f for f in rep.figures if f.tool == "etl"):
        for duck in (f for t in tools for f in rep.figures if f.tool == t and f.rows == ours.rows):
            out.append(Ratio(ours.rows, duck.tool, ours.wall / duck.wall, ours.cpu / duck.cpu, ours.peak_rss_mb / duck.peak_rss_mb))
    return out


def _compare(tool: str, kind: str, ours: Path, theirs: Path, name: str) -> bool | None:
    """Whether ``tool``'s output equals ours (True for ours; None for the polars hash, other ids by construction);
    RuntimeError naming the first difference when it does not."""
    if tool == "etl" or (tool == "polars" and kind == "hash"):
        return True if tool == "etl" else None
    why = baselines.first_difference(theirs, ours)
    if why is not None:
        raise RuntimeError(f"the {tool} script's output differs from etl preprocess's for {name}: {why}")
    return True


def library_versions() -> dict[str, str]:
    """The versions of Python and of the libraries the measured processes run on, by name (the importable ones)."""
    import importlib.metadata
    import platform

    versions = {"Python": platform.python_version()}
    for name, dist in (("DuckDB", "duckdb"), ("polars", "polars"), ("pyarrow", "pyarrow"), ("numba", "numba")):
        try:
            versions[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


#: The lines that open and close the block ``write_markdown`` keeps up to date in a Markdown file.
MARKDOWN_BEGIN = "<!-- etl bench --processes: begin (written by the command below; edits inside are replaced) -->"
MARKDOWN_END = "<!-- etl bench --processes: end -->"


def to_markdown(report: ProcessReport, command: str, when: str, versions: dict[str, str]) -> str:
    """The report as a Markdown block between ``MARKDOWN_BEGIN`` and ``MARKDOWN_END``: the command that made it,
    ``when``, the library ``versions``, then per pipeline the figures, the fixed and marginal costs and ours over
    each DuckDB script (below 1: ours is faster or smaller)."""
    libs = ", ".join(f"{name} {v}" for name, v in versions.items())
    out = [MARKDOWN_BEGIN, "", "```bash", command, "```", "",
           f"{when}; {report.cores} core(s), `--workers {report.workers}`; {libs}. Whole processes, median of {report.repeat} "
           "interleaved round(s); CPU = user + system seconds; util = CPU / wall / cores; peak RSS of the process alone."]  # fmt: skip
    for rep in report.pipelines:
        out += ["", f"**{Path(rep.pipeline).name}**", "", "| rows | process | wall s | CPU s | util | peak RSS MiB | output |",
                "|---:|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for f in rep.figures:
            eq = "" if f.tool == "etl" else {True: "equal", False: "DIFFERS", None: "other hash"}[f.output_equal]
            out.append(f"| {f.rows:,} | {f.tool} | {f.wall:.2f} | {f.cpu:.2f} | {100 * f.cpu_utilisation:.0f} % | {f.peak_rss_mb:,.0f} | {eq} |")
        if rep.lines:
            out += ["", "| process | wall s fixed | wall s / M rows | CPU s fixed | CPU s / M rows | RSS MiB fixed | RSS MiB / M rows |",
                    "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
            for tool, ln in rep.lines.items():
                out.append(f"| {tool} | {ln['wall'].fixed:.2f} | {ln['wall'].marginal:.2f} | {ln['cpu'].fixed:.2f} | {ln['cpu'].marginal:.2f} | "
                           f"{ln['peak_rss_mb'].fixed:,.0f} | {ln['peak_rss_mb'].marginal:,.0f} |")  # fmt: skip
        ratios = against_duckdb(rep)
        if ratios:
            out += ["", "| rows | ours / | wall | CPU s | peak RSS |", "|---:|---|---:|---:|---:|"]
            out += [f"| {r.rows:,} | {r.tool} | {r.wall:.2f} | {r.cpu:.2f} | {r.peak_rss:.2f} |" for r in ratios]
        out += [f"\n{tool} skipped: {why}" for tool, why in rep.skipped.items()]
    return "\n".join([*out, "", MARKDOWN_END]) + "\n"


def markdown_span(path: Path) -> tuple[str, tuple[int, int] | None]:
    """The text of the Markdown file ``path`` ("" when it does not exist) and the span of its block from
    ``MARKDOWN_BEGIN`` to ``MARKDOWN_END`` (None: it has none). ValueError when it holds one marker without the
    other, or either twice; the bench checks this before it runs, so that no run is lost to a file it cannot update."""
    text = path.read_text() if path.exists() else ""
    begins, ends = text.count(MARKDOWN_BEGIN), text.count(MARKDOWN_END)
    if (begins, ends) == (0, 0):
        return text, None
    if (begins, ends) != (1, 1) or text.index(MARKDOWN_BEGIN) > text.index(MARKDOWN_END):
        raise ValueError(f"{path}: expected one block from {MARKDOWN_BEGIN!r} to {MARKDOWN_END!r}, found {begins} begin and {ends} end line(s)")
    return text, (text.index(MARKDOWN_BEGIN), text.index(MARKDOWN_END) + len(MARKDOWN_END))


def write_markdown(path: Path, block: str) -> None:
    """Put ``block`` (from ``to_markdown``) into the Markdown file ``path``: in place of its block (``markdown_span``)
    where it has one, else at its end (a missing file is created), through a temporary file and a rename."""
    text, span = markdown_span(path)
    if span is None:
        text = text + ("\n" if text and not text.endswith("\n") else "") + ("\n" if text else "") + block
    else:
        text = text[: span[0]] + block.rstrip("\n") + text[span[1] :]
    atomic_write_bytes(path, text.encode())  # an interrupted write leaves the file as it was
