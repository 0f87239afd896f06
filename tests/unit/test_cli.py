"""Pieces of etl.cli tested in process: how several values after one flag are spread, and the per-pass progress
bars (the commands themselves run in a subprocess in tests/integration/test_cli.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from etl import cli


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--input", "a", "b", "c"], ["--input", "a", "--input", "b", "--input", "c"]),
        (["--input=a", "b", "--workers", "2"], ["--input=a", "--input", "b", "--workers", "2"]),
        (["--input", "a", "--input", "b"], ["--input", "a", "--input", "b"]),
        (["--workers", "2", "--pipeline", "p", "x"], ["--workers", "2", "--pipeline", "p", "x"]),  # not a list option
        (["--input", "a", "--", "b"], ["--input", "a", "--", "b"]),
        (["--input", "a", "-", "b"], ["--input", "a", "--input", "-", "--input", "b"]),
    ],
)
def test_spread_values(args: list[str], expected: list[str]) -> None:
    assert cli.spread_values(args, {"--input"}) == expected


def test_progress_bars_show_one_bar_per_pass(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=out, force_terminal=True, width=100))
    with cli.progress_bars(10) as report:
        report("fit", 4)
        report("fit", 6)
        report("transform", 10)
    text = out.getvalue()
    assert "fit" in text and "10/10" in text and "transform" in text


def test_progress_bars_off_a_terminal_show_nothing(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=out, force_terminal=False, width=100))
    with cli.progress_bars(10) as report:
        report("fit", 10)
    assert out.getvalue() == ""
