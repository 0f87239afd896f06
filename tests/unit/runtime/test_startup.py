"""``etl.runtime.startup.prepare``, each case in a process of its own (it freezes the garbage collector of the
process it runs in)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def prepared(command: str) -> dict:
    """What ``prepare(command)`` left in a fresh process: the libraries imported, the objects frozen, whether the
    collector still runs."""
    code = f"""
import gc, json, sys
from etl.runtime.startup import prepare
before = gc.get_freeze_count()
prepare({command!r})
print(json.dumps({{"modules": sorted(m for m in ("numba", "polars", "pyarrow.parquet", "etl.pipeline") if m in sys.modules),
                  "frozen_before": before, "frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


@pytest.mark.parametrize("command", ["preprocess", "fit", "bench"])
def test_a_data_command_imports_its_libraries_then_freezes_them(command: str) -> None:
    got = prepared(command)
    assert {"numba", "pyarrow.parquet", "etl.pipeline"} <= set(got["modules"])
    assert got["frozen_before"] == 0 and got["frozen"] > 50_000  # numba's and pyarrow's objects among them
    assert got["enabled"]  # collections still run, over what comes after


def test_another_command_imports_nothing_more_and_freezes_what_is_there() -> None:
    got = prepared("list")
    assert got["modules"] == [] and 0 < got["frozen"] < 50_000 and got["enabled"]


def test_garbage_from_before_is_collected_not_frozen() -> None:
    """An object in a reference cycle, unreachable when ``prepare`` runs (a dropped loader whose threads stop when it
    is collected), is collected then: freezing it would keep it, and its threads, for the life of the process."""
    code = """
import gc, weakref
from etl.runtime.startup import prepare
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
collected = []
weakref.finalize(a, collected.append, "a")
del a, b
prepare("list")
print(collected)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "['a']"


def test_the_program_prepares_its_process_and_the_command_line_run_from_python_does_not() -> None:
    """``python -m etl`` (as the ``etl`` script) freezes its imports before the command; ``etl.cli.app`` called in a
    process that has other work (tests, a user's program) leaves that process's collector alone."""
    from typer.testing import CliRunner

    from etl import cli

    code = """
import atexit, gc, json, runpy, sys
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count(), "numba": "numba" in sys.modules})))
sys.argv = ["etl", "generate", "--help"]
runpy.run_module("etl", run_name="__main__", alter_sys=True)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["frozen"] > 50_000 and got["numba"]  # generate is a data command: its libraries came first
    before = gc.get_freeze_count()
    assert CliRunner().invoke(cli.app, ["list"]).exit_code == 0
    assert gc.get_freeze_count() == before
