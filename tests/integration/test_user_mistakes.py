"""Plausible mistakes, as a user makes them on the command line (a subprocess), each answered by one line that says
what to do: Criteo's schema on a comma-separated file, text given to ``etl preprocess`` / ``etl fit``, Ctrl-C (what
is kept and the command that resumes, exit 130)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import CRITEO_8K, run_etl

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
