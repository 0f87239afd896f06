"""`etl bench` as a user runs it, at a small size: it finishes, the JSON has every field, baselines agree."""

from __future__ import annotations

import json
from pathlib import Path

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

STAGES_CATEGORIFY = ["floor", "fit", "columns", "0:FillMissing", "1:Clamp", "2:Log1p", "3:Decode", "4:Categorify"]
STAGES_CATEGORIFY += ["output", "batch", "ring", "preprocess", "preprocess:process", "loader"]


def test_bench_small_run_writes_json_and_plot(tmp_path: Path) -> None:
    js, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = run_etl("bench", "--rows", 12_000, "--files", 2, "--batch-size", 4096, "--device", "cpu", "--model", "--json", js, "--plot", png)
    assert "peak memory" in proc.stdout and "output equal" in proc.stdout
    doc = json.loads(js.read_text())
    assert doc["rows"] == 12_000 and doc["files"] == 2 and doc["peak_rss_mb"] > 0 and doc["input_mbytes"] > 0
    cat, hashed = doc["pipelines"]
    assert [s["name"] for s in cat["stages"]] == STAGES_CATEGORIFY
    assert "fit" not in [s["name"] for s in hashed["stages"]]
    for rep in (cat, hashed):
        assert all(s["seconds"] > 0 and s["rows"] == 12_000 and s["rows_per_second"] > 0 for s in rep["stages"])
        assert 0 <= rep["data_wait"] <= 1 and 0 <= rep["data_wait_first_epoch"] <= 1 and 0 <= rep["model_data_wait"] <= 1
        assert len(rep["wait_timeline"]) == 3  # ceil(12,000 / 4,096) batches
    assert cat["baselines"]["polars"]["output_equal"] is True and cat["baselines"]["numpy"]["output_equal"] is True
    assert hashed["baselines"]["numpy"]["output_equal"] is True and hashed["baselines"]["polars"]["output_equal"] is None
    assert cat["baselines"]["polars:process"]["output_equal"] is True and hashed["baselines"]["polars:process"]["output_equal"] is None
    for rep in (cat, hashed):
        process = rep["baselines"]["polars:process"]
        ours = next(s for s in rep["stages"] if s["name"] == "preprocess:process")
        assert process["speedup_of_ours"] == process["seconds"] / ours["seconds"] and process["versus"] == "etl preprocess process"
    assert "baseline polars:process:" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_on_given_input_without_baselines_or_device_placement(tmp_path: Path) -> None:
    """Both default pipelines on shards given with --input; on CPU without --device-placement there is no device
    part: no ``dp:`` stage and no device data wait."""
    raw = tmp_path / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 10_000, 2, raw)
    js = tmp_path / "b.json"
    run_etl("bench", "--input", raw, "--no-baselines", "--batch-size", 2048, "--device", "cpu", "--json", js)
    doc = json.loads(js.read_text())
    assert doc["rows"] == 10_000 and all(rep["baselines"] == {} for rep in doc["pipelines"])
    assert [Path(rep["pipeline"]).name for rep in doc["pipelines"]] == ["criteo.yaml", "criteo_hash.yaml"]
    assert all("preprocess:process" in [s["name"] for s in rep["stages"]] for rep in doc["pipelines"])
    for rep in doc["pipelines"]:
        assert not any(s["name"].startswith("dp:") for s in rep["stages"]) and rep["device_data_wait"] is None


def test_bench_follow_reports_lags_of_every_shard_listed_in_a_producer_manifest(tmp_path: Path) -> None:
    js = tmp_path / "follow.json"
    proc = run_etl("bench", "--follow", "--rate", 10, "--shard-rows", 3000, "--duration", 0.5, "--poll-interval", 0.05,
                   "--batch-size", 1000, "--arrivals", "manifest", "--json", js)  # fmt: skip
    assert "freshness: 6 shards of 3,000 rows at 10/s (arrivals: manifest)" in proc.stdout
    assert "must hold p99 < 2 x poll + shard transform" in proc.stdout
    doc = json.loads(js.read_text())
    assert doc["rows"] == 18_000 and doc["files"] == 6
    (rep,) = doc["pipelines"]
    assert rep["pipeline"].endswith("criteo_hash.yaml")
    assert [s["name"] for s in rep["stages"]] == ["shard transform", "follow"] and rep["stages"][1]["rows"] == 18_000
    f = rep["freshness"]
    assert len(f["lags"]) == 6 and all(lag >= 0 for lag in f["lags"]) and f["lag_p50"] <= f["lag_p99"] <= f["lag_max"]
    assert f["arrivals"] == "manifest"
    assert f["bound"] == 2 * 0.05 + f["shard_transform_seconds"] and f["holds"] == (f["lag_p99"] < f["bound"])


def test_bench_processes_at_two_sizes_reports_every_whole_process_and_the_fixed_and_marginal_costs(tmp_path: Path) -> None:
    import importlib.util

    js, md = tmp_path / "proc.json", tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    proc = run_etl("bench", "--processes", "--sizes", "3000,6000", "--repeat", 1, "--json", js, "--markdown", md)
    doc = json.loads(js.read_text())
    assert doc["sizes"] == [3000, 6000] and doc["repeat"] == 1 and doc["cores"] >= 1
    has_duckdb = importlib.util.find_spec("duckdb") is not None
    for rep, kind in zip(doc["pipelines"], ("categorify", "hash")):
        tools = ["etl", "duckdb", "duckdb-joined", "polars"] if kind == "categorify" else ["etl", "duckdb", "polars"]
        if not has_duckdb:
            tools = ["etl", "polars"]
        assert [(f["rows"], f["tool"]) for f in rep["figures"]] == [(n, t) for n in (3000, 6000) for t in tools]
        for f in rep["figures"]:
            assert f["wall"] > 0 and f["cpu"] > 0 and f["peak_rss_mb"] > 0 and f["cpu_utilisation"] > 0 and len(f["runs"]) == 1
            want = None if (f["tool"], kind) == ("polars", "hash") else True
            assert f["output_equal"] is want
        assert set(rep["lines"]) == set(tools)
        assert all(set(line) == {"wall", "cpu", "peak_rss_mb"} for line in rep["lines"].values())
        if not has_duckdb:
            assert "duckdb is not importable" in rep["skipped"]["duckdb"]
    assert "fixed (intercept) and marginal" in proc.stdout
    table = md.read_text()
    assert table.startswith("# Benchmarks\n") and "etl bench --processes --sizes 3000,6000 --repeat 1 --workers 2" in table
    assert "**criteo.yaml**" in table and "**criteo_hash.yaml**" in table and "| 6,000 | etl |" in table
    if has_duckdb:
        assert "6,000 rows, ours / duckdb: wall" in proc.stdout and "6,000 rows, ours / duckdb-joined: wall" in proc.stdout


def test_bench_processes_refuses_a_markdown_file_it_could_not_update_before_it_runs(tmp_path: Path) -> None:
    from etl.bench.processes import MARKDOWN_BEGIN

    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"# Benchmarks\n{MARKDOWN_BEGIN}\n")  # a block without its end line
    proc = run_etl("bench", "--processes", "--sizes", "3000,6000", "--repeat", 1, "--markdown", md, check=False)
    assert proc.returncode == 2 and "expected one block" in proc.stderr and str(md) in proc.stderr
    assert "generating" not in proc.stdout + proc.stderr and md.read_text() == f"# Benchmarks\n{MARKDOWN_BEGIN}\n"
