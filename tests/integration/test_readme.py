"""The README's examples run as written: "At serving time" transforms one request with artifacts fitted on the real
Criteo sample, and its ids and values equal a plain-Python reference."""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np

from tests.conftest import REPO, run_etl


def readme_block(heading: str) -> str:
    """The first ```python block of the README section ``heading``."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under '## {heading}'"
    return match.group(1)


def test_at_serving_time(criteo_8k: Path, tmp_path: Path, monkeypatch) -> None:
    files = sorted(criteo_8k.glob("*.csv"))
    run_etl("convert", *files, "--schema", REPO / "schemas/criteo.yaml", "--out", tmp_path / "raw")
    run_etl("fit", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", tmp_path / "raw", "--artifacts",
            tmp_path / "data/processed/artifacts")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(readme_block("At serving time"), scope)
    row = scope["features"].to_pylist()
    assert len(row) == 1 and "label" not in row[0]

    counts: Counter = Counter()
    for f in files:
        with open(f, newline="") as fh:
            counts.update(int(r[14], 16) for r in csv.reader(fh, delimiter="\t") if r[14])
    kept = sorted((k for k, n in counts.items() if n >= 3), key=lambda k: (-counts[k], k))  # freq_threshold 3
    assert row[0]["C1"] == 3 + kept.index(0x68FD1E64)  # 0 pad, 1 missing, 2 the out-of-vocabulary bucket, then the vocabulary
    assert row[0]["I1"] == np.float32(math.log1p(5))
    assert all(row[0][f"I{i}"] == 0.0 for i in range(2, 14)) and all(row[0][f"C{i}"] == 1 for i in range(2, 27))
