"""Plausible mistakes, as a user makes them on the command line (a subprocess), each answered by one line that says
what to do: Criteo's schema on a comma-separated file, text given to ``etl preprocess`` / ``etl fit``, Ctrl-C (what
is kept and the command that resumes, exit 130)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import CRITEO_8K, run_etl, tree_bytes

needs_criteo = pytest.mark.skipif(not CRITEO_8K.is_dir(), reason=f"real Criteo sample not at {CRITEO_8K}")


def one_line_error(proc) -> str:  # noqa: ANN001 - a CompletedProcess
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@needs_criteo
def test_criteo_schema_on_a_comma_separated_file_suggests_the_delimiter(tmp_path: Path) -> None:
    comma = tmp_path / "day_0.csv"
    comma.write_text((CRITEO_8K / "train.csv").read_text().replace("\t", ","))
    line = one_line_error(run_etl("convert", comma, "--schema", "criteo", "--out", tmp_path / "raw", check=False))
    assert "line 1: wrong number of fields: expected 40, got 1" in line
    assert 'the line looks comma-separated, and the schema' in line and 'says tab-separated: set text: {delimiter: ","}' in line
    assert f"etl schema infer {comma}" in line


@needs_criteo
@pytest.mark.parametrize("command", ["preprocess", "fit"])
def test_text_given_as_raw_shards_shows_the_convert_command(tmp_path: Path, command: str) -> None:
    days = tmp_path / "days"
    days.mkdir()
    shutil.copy(CRITEO_8K / "train.csv", days / "day_0.tsv")
    out = ["--out", tmp_path / "out"] if command == "preprocess" else ["--artifacts", tmp_path / "art"]
    for given, source in ((days / "day_0.tsv", days / "day_0.tsv"), (days, f"'{days}/*.tsv'")):
        line = one_line_error(run_etl(command, "--pipeline", "criteo", "--input", given, *out, check=False))
        assert "delimited text" in line and "not Parquet shards" in line and "magic bytes" not in line, line
        raw = tmp_path / "days_raw" if given == days else days / "day_0_raw"
        assert line.endswith(f"etl convert {source} --schema criteo --out {raw}"), line
    run_etl("convert", days / "day_0.tsv", "--schema", "criteo", "--out", days / "day_0_raw")  # the command shown works
    run_etl(command, "--pipeline", "criteo", "--input", days / "day_0_raw", *out)


@needs_criteo
def test_convert_into_a_directory_of_shards_refuses_overwrites_or_appends(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    run_etl("convert", CRITEO_8K / "train.csv", "--schema", "criteo", "--out", raw, "--rows-per-file", 3000)
    day_0 = tree_bytes(raw)
    assert sorted(day_0) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    line = one_line_error(run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo", "--out", raw, check=False))
    assert line == (f"error: {raw}: holds 3 shard(s) already (part-00000.parquet .. part-00002.parquet); --overwrite replaces them, "
                    "--append adds the new shards after them")  # fmt: skip
    assert tree_bytes(raw) == day_0
    both = one_line_error(run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo", "--out", raw, "--overwrite", "--append", check=False))
    assert "give one of them" in both and tree_bytes(raw) == day_0

    appended = run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo", "--out", raw, "--append")
    assert "wrote 1 shard(s), 409 rows, to" in appended.stdout and "after the 3 it held" in appended.stdout
    assert {k: v for k, v in tree_bytes(raw).items() if k in day_0} == day_0 and "part-00003.parquet" in tree_bytes(raw)
    fitted = run_etl("fit", "--pipeline", "criteo", "--input", raw, "--artifacts", tmp_path / "art")
    assert "on 7,609 rows" in fitted.stdout  # both days
    done = run_etl("preprocess", "--pipeline", "criteo", "--input", raw, "--artifacts", tmp_path / "art", "--out", tmp_path / "out")
    assert "rows: 7,609 in = 7,609 out" in done.stdout

    mismatch = one_line_error(run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo_sample", "--out", raw, "--append", check=False))
    assert "which is not a shard of this schema's layout" in mismatch

    replaced = tmp_path / "replaced"
    run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo", "--out", replaced)
    run_etl("convert", CRITEO_8K / "dev.csv", "--schema", "criteo", "--out", raw, "--overwrite")
    assert tree_bytes(raw) == tree_bytes(replaced)  # the old shards gone, as a convert into a new directory
