"""Pieces of etl.cli tested in process: how several values after one flag are spread, and the per-pass progress
bars (the commands themselves run in a subprocess in tests/integration/test_cli.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import click
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

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


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the ``etl`` group, subcommands of subgroups included, as argument lists."""
    paths = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


@pytest.mark.parametrize("args", _command_paths(typer.main.get_command(cli.app)), ids=" ".join)  # type: ignore[arg-type]
def test_help_fits_80_columns_and_shows_every_word(args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli.app, [*args, "--help"], env={"COLUMNS": "80"}, prog_name="etl")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("Usage: etl"), result.output
    assert max(len(line) for line in lines) <= 80, result.output
    assert "…" not in result.output, result.output  # a word cut short
    assert not any(line.rstrip().endswith("...") for line in lines[1:]), result.output  # a command's help cut short


def test_help_keeps_square_brackets() -> None:
    result = CliRunner().invoke(cli.app, ["bench", "--help"], env={"COLUMNS": "80"})
    assert "pip install 'etl[dali]'" in " ".join(result.output.split())


def test_ctrl_c_in_fit_says_nothing_is_saved_and_exits_130(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from etl.pipeline import Pipeline
    from etl.tools.synth import generate

    generate(Pipeline.from_file("criteo").schema, 100, 1, tmp_path / "raw")

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Pipeline, "fit", interrupted)
    args = ["fit", "--pipeline", "criteo", "--input", str(tmp_path / "raw"), "--artifacts", str(tmp_path / "art")]
    monkeypatch.setattr(sys, "argv", ["etl", *args])
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 130
    assert result.stderr == (f"interrupted: nothing saved to {tmp_path / 'art'} (a fit saves its artifacts when it ends); the same command "
                             f"fits again: etl {' '.join(args)}\n")  # fmt: skip
    assert not (tmp_path / "art").exists()
