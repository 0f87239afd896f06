"""The runnable blocks of the README and the guides run as written.

Each file's blocks marked ``bash run`` or ``python run`` run in order in one fresh directory that holds what the
repository root holds for a reader of the guides (``schemas/``, ``pipelines/``, ``scripts/``, ``examples/``, and
MovieLens' ``ml-latest-small/`` from the shared data when a block names it), with ``etl`` and ``python`` the ones
under test. A block that fails fails the test with its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO
from tests.docs import GUIDES, blocks

RUNNABLE = {p.relative_to(REPO).as_posix(): [b for b in blocks(p.read_text()) if b.runnable] for p in GUIDES}
LINKED = ("schemas", "pipelines", "scripts", "examples")
MOVIELENS = DATA / "movielens-ml-latest-small"


def test_every_guide_has_runnable_blocks() -> None:
    """Every guide shows at least one example that runs (the layout page is a map, not a guide)."""
    assert [name for name, found in RUNNABLE.items() if not found and name != "docs/architecture.md"] == []
    assert all(b.lang in ("bash", "python") for found in RUNNABLE.values() for b in found)


@pytest.mark.parametrize("name", [name for name, found in RUNNABLE.items() if found])
def test_runnable_blocks(name: str, tmp_path: Path) -> None:
    found = RUNNABLE[name]
    for entry in LINKED:
        if (REPO / entry).exists():
            (tmp_path / entry).symlink_to(REPO / entry)
    if any("ml-latest-small/" in b.text for b in found):
        if not MOVIELENS.is_dir():
            pytest.skip(f"{name} reads MovieLens: no {MOVIELENS}")
        (tmp_path / "ml-latest-small").symlink_to(MOVIELENS)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    for tool, run in (("etl", f'"{sys.executable}" -m etl'), ("python", f'"{sys.executable}"')):
        (bin_dir / tool).write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    for i, block in enumerate(found):
        if block.lang == "bash":
            command = ["bash", "-euo", "pipefail", "-c", block.text]
        else:
            script = tmp_path / f".block_{i}.py"
            script.write_text(block.text)
            command = [sys.executable, str(script)]
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{name}, runnable block {i + 1}:\n{block.text}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
