"""The package's public names: listed by ``dir(etl)`` and ``etl.__all__``, imported by ``from etl import *``, each
imported on first use (``import etl`` alone loads no torch). Each check runs in a fresh process, as a user's would."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.conftest import REPO

PUBLIC = {"Loader", "LoaderBatch", "LoaderError", "LoaderStats", "Pipeline", "load_schema", "raw_arrow_schema"}


def _run(code: str) -> Any:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def test_dir_lists_the_public_names_without_importing_them() -> None:
    got = _run("import json, sys, etl; print(json.dumps({'dir': dir(etl), 'all': etl.__all__, 'torch': 'torch' in sys.modules}))")
    assert PUBLIC <= set(got["dir"]) and set(got["all"]) <= set(got["dir"])
    assert {"__doc__", "__name__", "__path__"} <= set(got["dir"])
    assert not {"import_module", "Any", "ModuleType", "_EXPORTS"} & set(got["dir"])  # the module's own helpers stay out
    assert got["torch"] is False


def test_star_import_gives_every_public_name() -> None:
    got = _run("import json; from etl import *; print(json.dumps(sorted(n for n in dir() if not n.startswith('_') and n != 'json')))")
    assert PUBLIC <= set(got)


def test_a_submodule_imported_shows_in_dir() -> None:
    got = _run("import json, etl, etl.schema; print(json.dumps(dir(etl)))")
    assert "schema" in got and "load_schema" in got
