"""etl.bench.processes: one process's accounting, the fixed and marginal costs, the output checks."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.bench import processes
from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]


def test_fit_line_through_two_sizes_splits_fixed_and_marginal() -> None:
    line = processes.fit_line([2_000_000, 8_000_000], [3.0, 9.0])
    assert line.fixed == pytest.approx(1.0) and line.marginal == pytest.approx(1.0)  # 1 s + 1 s per million rows
    line = processes.fit_line([1_000_000, 2_000_000, 3_000_000], [1.0, 3.0, 2.0])  # least squares over three
    assert line.marginal == pytest.approx(0.5) and line.fixed == pytest.approx(1.0)


@pytest.mark.parametrize("rows, values", [([2_000_000], [3.0]), ([5, 5], [1.0, 2.0]), ([1, 2], [1.0])])
def test_fit_line_needs_two_distinct_sizes(rows: list[int], values: list[float]) -> None:
    with pytest.raises(ValueError, match="two sizes"):
        processes.fit_line(rows, values)


def test_run_process_accounts_for_that_process_alone(tmp_path: Path) -> None:
    """A child that touches 200 MB and burns CPU: its peak RSS is its own (not the bench's, whose pages a forked
    child would otherwise count), its CPU seconds are its own."""
    burn = "import time\nb = bytearray(200 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
    burn += "t = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    ballast = bytearray(400 * 2**20)  # this process: well over the child's peak
    ballast[::4096] = b"y" * len(ballast[::4096])
    run = processes.run_process([sys.executable, "-c", burn], tmp_path / "out")
    assert 200 <= run.peak_rss_mb < 400 and run.cpu >= 0.3 and run.wall >= run.cpu / 4 and run.cpu == run.user + run.sys


def test_run_process_reports_a_failing_command(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exit status 3.*boom"):
        processes.run_process([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"], tmp_path / "out")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("processes")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 2_000, 2, d / "raw", seed=0)
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), list_shards(d / "raw"), d / "ours", workers=1)
    return d


def test_compare_fails_loudly_on_one_changed_value(outputs: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    shutil.copytree(outputs / "ours", theirs)
    assert processes._compare("duckdb", "categorify", outputs / "ours", theirs, "criteo") is True
    part = theirs / "part-00001.parquet"
    t = pq.read_table(part)
    c5 = t.column("C5").to_pylist()
    c5[17] += 1
    pq.write_table(t.set_column(t.schema.get_field_index("C5"), "C5", pa.array(c5, pa.int32())), part)
    with pytest.raises(RuntimeError, match=r"duckdb script's output differs.*part-00001.parquet: column 'C5' row 17"):
        processes._compare("duckdb", "categorify", outputs / "ours", theirs, "criteo")
    assert processes._compare("polars", "hash", outputs / "ours", theirs, "criteo") is None  # polars' own hash: not compared


def test_median_figures_and_utilisation() -> None:
    runs = [processes.ProcessRun(2.0, 1.5, 0.5, 100.0), processes.ProcessRun(4.0, 3.0, 1.0, 300.0), processes.ProcessRun(3.0, 2.0, 1.0, 200.0)]
    f = processes._median_figures("etl", 1000, runs, 2, True)
    assert (f.wall, f.cpu, f.peak_rss_mb) == (3.0, 3.0, 200.0) and f.cpu_utilisation == pytest.approx(0.5)


def test_without_duckdb_its_rows_are_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """One size: figures of the processes that ran, no lines (a line needs two sizes), DuckDB skipped and why."""
    monkeypatch.setattr(processes.duckdb_baselines, "HAS_DUCKDB", False)
    report = processes.run_process_bench([REPO / "pipelines/criteo_hash.yaml"], [2_000], repeat=1)
    (rep,) = report.pipelines
    assert [f.tool for f in rep.figures] == ["etl", "polars"] and rep.lines == {}
    assert rep.skipped == {"duckdb": "duckdb is not importable (pip install 'etl[bench]')"}
    assert [f.output_equal for f in rep.figures] == [True, None] and all(len(f.runs) == 1 for f in rep.figures)


def small_report() -> processes.ProcessReport:
    """A report of one pipeline at two sizes: ours and two DuckDB scripts, made-up figures."""
    rep = processes.PipelineProcesses("/x/criteo.yaml")
    for rows, scale in ((1_000_000, 1.0), (3_000_000, 2.0)):
        rep.figures += [processes.ToolFigures("etl", rows, 1.0 * scale, 1.5 * scale, 500.0, 0.75, True),
                        processes.ToolFigures("duckdb", rows, 4.0 * scale, 6.0 * scale, 250.0, 0.75, True),
                        processes.ToolFigures("duckdb-joined", rows, 2.0 * scale, 3.0 * scale, 1000.0, 0.75, True)]  # fmt: skip
    for tool in ("etl", "duckdb", "duckdb-joined"):
        figs = [f for f in rep.figures if f.tool == tool]
        rep.lines[tool] = {w: processes.fit_line([f.rows for f in figs], [getattr(f, w) for f in figs]) for w in ("wall", "cpu", "peak_rss_mb")}
    return processes.ProcessReport([1_000_000, 3_000_000], 2, 2, 3, [rep])


def test_ours_over_each_duckdb_script_size_by_size() -> None:
    ratios = processes.against_duckdb(small_report().pipelines[0])
    assert [(r.rows, r.tool, r.wall, r.cpu, r.peak_rss) for r in ratios] == [
        (1_000_000, "duckdb", 0.25, 0.25, 2.0), (1_000_000, "duckdb-joined", 0.5, 0.5, 0.5),
        (3_000_000, "duckdb", 0.25, 0.25, 2.0), (3_000_000, "duckdb-joined", 0.5, 0.5, 0.5),
    ]  # fmt: skip


def test_markdown_block_replaces_the_last_one_and_keeps_the_rest(tmp_path: Path) -> None:
    block = processes.to_markdown(small_report(), "etl bench --processes --sizes 1000000,3000000", "2026-12-03", {"DuckDB": "2.0.1"})
    assert block.startswith(processes.MARKDOWN_BEGIN) and block.rstrip().endswith(processes.MARKDOWN_END)
    assert "| 3,000,000 | duckdb-joined | 4.00 | 6.00 | 75 % | 1,000 | equal |" in block
    assert "| 1,000,000 | duckdb-joined | 0.50 | 0.50 | 0.50 |" in block and "DuckDB 2.0.1" in block
    assert "| etl | 0.50 | 0.50 | 0.75 | 0.75 | 500 | 0 |" in block  # fixed and marginal: through both points
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nbefore\n")
    processes.write_markdown(doc, block)  # no block yet: appended
    assert doc.read_text() == "# Benchmarks\n\nbefore\n\n" + block
    doc.write_text(doc.read_text() + "\nafter\n")
    newer = block.replace("2026-12-03", "2026-12-04")
    processes.write_markdown(doc, newer)  # replaced in place, the text around it kept
    assert doc.read_text() == "# Benchmarks\n\nbefore\n\n" + newer + "\nafter\n"
    processes.write_markdown(tmp_path / "new.md", block)
    assert (tmp_path / "new.md").read_text() == block


@pytest.mark.parametrize("text", [processes.MARKDOWN_BEGIN + "\n", processes.MARKDOWN_END + "\n" + processes.MARKDOWN_BEGIN + "\n",
                                  (processes.MARKDOWN_BEGIN + "\n" + processes.MARKDOWN_END + "\n") * 2])  # fmt: skip
def test_markdown_block_refuses_a_file_whose_markers_do_not_pair(tmp_path: Path, text: str) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(text)
    with pytest.raises(ValueError, match="expected one block"):
        processes.write_markdown(doc, processes.to_markdown(small_report(), "etl bench --processes", "today", {}))
    assert doc.read_text() == text
