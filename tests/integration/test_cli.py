"""The command line as a user runs it (a subprocess), on the real Criteo sample: the version, -h everywhere, several
values after one flag and glob patterns (the same files as listed one by one), bad option values as one line with
exit status 2, and summaries that print only what ran."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from tests.conftest import REPO, run_etl, tree_bytes

CRITEO = REPO / "pipelines/criteo.yaml"
HASH = REPO / "pipelines/criteo_hash.yaml"
SCHEMA = REPO / "schemas/criteo.yaml"
COMMANDS = ["convert", "generate", "fit", "preprocess", "demo", "bench", "inspect"]


@pytest.fixture
def raw(criteo_8k_glob_shards: Path) -> Path:
    """The three files of the sample converted with a quoted glob pattern (expanded by etl, in name order)."""
    return criteo_8k_glob_shards


def test_version_comes_from_the_package_metadata() -> None:
    assert run_etl("--version").stdout.strip() == f"etl {importlib.metadata.version('etl')}"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_h_is_help_on_every_command(command: str | None) -> None:
    args = [command] if command else []
    short = run_etl(*args, "-h")
    assert "Usage" in short.stdout and short.stdout == run_etl(*args, "--help").stdout


def test_a_glob_pattern_names_the_files_listed_one_by_one(criteo_8k: Path, raw: Path, tmp_path: Path) -> None:
    listed = tmp_path / "listed"
    run_etl("convert", *sorted(criteo_8k.glob("*.csv")), "--schema", SCHEMA, "--out", listed, "--rows-per-file", 3000)
    assert tree_bytes(listed) == tree_bytes(raw) and len(tree_bytes(raw)) >= 3


def test_several_values_after_one_flag(raw: Path, tmp_path: Path) -> None:
    shards = sorted(raw.glob("*.parquet"))
    rows = "8,000"  # the three files of the sample
    one_flag = run_etl("fit", "--pipeline", CRITEO, "--input", *shards, "--artifacts", tmp_path / "a", "--workers", 1)
    pattern = run_etl("fit", "--pipeline", CRITEO, "--input", f"{raw}/part-*.parquet", "--artifacts", tmp_path / "b", "--workers", 1)
    assert f"on {rows} rows" in one_flag.stdout and f"on {rows} rows" in pattern.stdout
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    repeated = ["--input", shards[0], "--input", *shards[1:]]
    run_etl("preprocess", "--pipeline", HASH, *repeated, "--out", tmp_path / "c")
    run_etl("preprocess", "--pipeline", HASH, "--input", shards[0], f"{raw}/part-0000[1-9].parquet", "--out", tmp_path / "d")
    assert tree_bytes(tmp_path / "c") == tree_bytes(tmp_path / "d")


def test_the_summary_prints_only_what_ran(raw: Path, tmp_path: Path) -> None:
    run_etl("fit", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "art")
    first = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "art", "--out", tmp_path / "out")
    lines = first.stdout.splitlines()
    assert not any(line.startswith("fit:") for line in lines)  # fitted artifacts given: nothing fitted
    assert any(line.startswith("transform: 8,000 rows") for line in lines) and "skipped" not in first.stdout
    again = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "art", "--out", tmp_path / "out")
    assert "already complete, skipped" in again.stdout
    assert not any(line.startswith(("fit:", "transform:")) for line in again.stdout.splitlines())  # nothing ran
    hashed = run_etl("preprocess", "--pipeline", HASH, "--input", raw, "--out", tmp_path / "hashed")
    assert not any(line.startswith("fit:") for line in hashed.stdout.splitlines())  # nothing to fit


def test_a_small_memory_budget_writes_the_bytes_of_a_run_that_held_everything_in_memory(raw: Path, tmp_path: Path) -> None:
    small = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--out", tmp_path / "small", "--memory-budget", "512K")
    stash = [line for line in small.stdout.splitlines() if line.startswith("stash:")]
    assert len(stash) == 1 and "(budget 0.5 MiB)" in stash[0] and not stash[0].endswith(" 0.0 MiB on disk"), small.stdout
    big = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--out", tmp_path / "big")
    assert "0.0 MiB on disk" in big.stdout
    assert tree_bytes(tmp_path / "small") == tree_bytes(tmp_path / "big")
    assert sorted(p.name for p in (tmp_path / "small").iterdir()) == sorted(p.name for p in (tmp_path / "big").iterdir())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["fit", "--pipeline", CRITEO, "--input", "RAW", "--artifacts", "OUT", "--workers", "0"], "'--workers'"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--workers", "-1"], "'--workers'"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--on-error", "skip"], "--on-error"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--compression", "gzip9"], "--compression"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--memory-budget", "lots"], "--memory-budget"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--format", "csv"], "--format"),
        (["preprocess", "--pipeline", HASH, "--input", "RAW", "--out", "OUT", "--format", "npy", "--npy-chunk-rows", "0"], "'--npy-chunk-rows'"),
        (["generate", "--schema", SCHEMA, "--rows", "many", "--out", "OUT"], "'--rows'"),
        (["generate", "--schema", SCHEMA, "--rows", "0", "--out", "OUT"], "'--rows'"),
        (["convert", "RAW/*.tsv", "--schema", SCHEMA, "--out", "OUT", "--rows-per-file", "0"], "'--rows-per-file'"),
        (["convert", "RAW/*.tsv", "--schema", SCHEMA, "--out", "OUT"], "no file or directory matches this pattern"),
        (["fit", "--pipeline", CRITEO, "--input", "RAW", "--artifacts", "OUT", "--no-such-option"], "--no-such-option"),
        (["fit", "--pipeline", CRITEO, "--input", "RAW"], "'--artifacts'"),
        (["bench", "--device", "gpu0", "--rows", "10"], "not a device"),
        (["bench", "--batch-size", "0"], "'--batch-size'"),
        (["bench", "--engine", "fast", "--rows", "10"], "--engine"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_a_bad_option_value_is_one_line_and_exit_status_2(raw: Path, tmp_path: Path, args: list, fragment: str) -> None:
    args = [str(a).replace("RAW", str(raw)).replace("OUT", str(tmp_path / "out")) for a in args]
    proc = run_etl(*args, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert not (tmp_path / "out").exists()


def test_bench_sequences_measures_history_and_groupby_on_generated_events(tmp_path: Path) -> None:
    import json

    out = run_etl("bench", "--sequences", "--rows", 2000, "--files", 2, "--repeat", 1, "--no-baselines", "--json", tmp_path / "seq.json")
    report = json.loads((tmp_path / "seq.json").read_text())
    assert report["rows"] == 2000 and report["files"] == 2
    assert [Path(p["pipeline"]).name for p in report["pipelines"]] == ["events_sequence.yaml", "events_sessions.yaml"]
    assert "loader:history" in out.stdout and "data wait" not in out.stdout
