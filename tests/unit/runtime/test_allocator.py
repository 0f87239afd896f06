"""etl.runtime.allocator: the malloc tuning happens only when asked for (command line, Loader), never on import, once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from etl.runtime import allocator

REPO = Path(__file__).resolve().parents[3]

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tuning applies to glibc on Linux")

# Run in a fresh interpreter: record every C-library symbol looked up through ctypes.CDLL, import everything that
# batch processing imports, then tune explicitly, twice.
_SPY = """
import ctypes
looked_up = []

class Spy(ctypes.CDLL):
    def __getitem__(self, name):
        looked_up.append(name)
        return super().__getitem__(name)

ctypes.CDLL = Spy
import etl.backends.cpu, etl.backends.tensor, etl.ops, etl.pipeline, etl.preprocess, etl.loader, etl.cli
from etl.runtime import allocator
print(looked_up.count("mallopt"), allocator._tuned)
allocator.tune_allocator()
allocator.tune_allocator()
print(looked_up.count("mallopt"), allocator._tuned)
"""


@linux_only
def test_importing_does_not_tune_and_tuning_twice_is_harmless():
    env = {k: v for k, v in os.environ.items() if k != "ETL_MALLOC_TUNING"}
    proc = subprocess.run([sys.executable, "-c", _SPY], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0 False", "1 True"]


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.mallopt = lambda param, value: self.calls.append((param, value)) or 1


@pytest.fixture
def fake_libc(monkeypatch: pytest.MonkeyPatch) -> _FakeLibc:
    libc = _FakeLibc()
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(allocator, "_tuned", False)
    return libc


@linux_only
def test_tune_allocator_sets_three_options_once(fake_libc, monkeypatch):
    monkeypatch.delenv("ETL_MALLOC_TUNING", raising=False)
    allocator.tune_allocator()
    allocator.tune_allocator()
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    assert fake_libc.calls == [(m_mmap_threshold, 32 << 20), (m_trim_threshold, 1 << 30), (m_top_pad, 64 << 20)]
    assert allocator._tuned


def test_environment_turns_tuning_off(fake_libc, monkeypatch):
    monkeypatch.setenv("ETL_MALLOC_TUNING", "0")
    allocator.tune_allocator()
    assert fake_libc.calls == [] and not allocator._tuned


def test_every_command_and_the_loader_tune(monkeypatch, tmp_path):
    from etl import cli
    from etl.loader import api

    calls = []
    monkeypatch.setattr(cli, "tune_allocator", lambda: calls.append("cli"))
    monkeypatch.setattr(api, "tune_allocator", lambda: calls.append("loader"))
    result = CliRunner().invoke(cli.app, ["inspect", str(tmp_path / "missing")])
    assert result.exit_code == 2
    with pytest.raises(ValueError):
        api.Loader(tmp_path, batch_size=0)
    assert calls == ["cli", "loader"]
