"""A regular (non-editable) install of etl works away from the source checkout: every package and the default
schemas and pipelines (package data) are installed, and `etl demo` runs on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO

SOURCES = ("pyproject.toml", "README.md", "etl", "schemas", "pipelines")


def copy_sources(dest: Path) -> None:
    """The files a build reads, copied to ``dest``: building writes build/ and *.egg-info/ beside its sources, so the
    checkout stays clean and no earlier build/ leaks into the wheel."""
    dest.mkdir(parents=True)
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, dest / name)


def pip_install(source: Path, target: Path) -> None:
    """``pip install --no-deps --target target source``: without build isolation when this interpreter has the
    build backend pyproject.toml asks for (no package index needed), else with it."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)]
    proc = subprocess.run([*cmd, "--no-build-isolation", "--check-build-dependencies"], capture_output=True, text=True)
    if proc.returncode != 0:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pyproject_lists_every_package() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "etl").rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | set(setuptools["package-dir"])


def test_regular_install_runs_demo_away_from_the_checkout(tmp_path: Path) -> None:
    source, target, elsewhere = tmp_path / "source", tmp_path.resolve() / "site", tmp_path / "elsewhere"
    copy_sources(source)
    pip_install(source, target)
    for kind in ("schemas", "pipelines"):
        packaged = sorted(p.name for p in (target / "etl/resources" / kind).iterdir())
        assert packaged == sorted(p.name for p in (REPO / kind).glob("*.yaml"))

    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    where = subprocess.run(
        [sys.executable, "-c", "import etl; from etl.resources import resource_path; "
                               "print(etl.__file__); print(resource_path('pipelines', 'criteo.yaml'))"],
        cwd=elsewhere, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    module, pipeline = map(Path, where.stdout.split())
    assert module == target / "etl/__init__.py" and pipeline == target / "etl/resources/pipelines/criteo.yaml"

    demo = subprocess.run([sys.executable, "-m", "etl", "demo", "--rows", "1000", "--files", "1", "--workdir", "demo"],
                          cwd=elsewhere, env=env, capture_output=True, text=True)  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "rows: 1,000 in = 1,000 out + 0 quarantined" in demo.stdout
    assert (elsewhere / "demo/processed/manifest.json").is_file()
