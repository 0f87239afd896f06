#!/usr/bin/env python3
"""`etl preprocess` in threads against `etl preprocess --cluster local:N`, in one run, on the same files.

Fits the pipeline once (`etl fit`, timed: the fit's per-core rate), then runs `etl preprocess --artifacts ...`
alternately in ``--workers N`` threads and on ``--cluster local:N`` (``--repeat`` times each, a fresh output
directory every time), as a user runs them. For each run it records the wall time of the command (interpreter
start, cluster start and stop included) and the transform time the command reports (shards only), and checks that
every output file is byte-identical to the first threaded run's. Prints a table and the medians' ratios.

    python scripts/bench_cluster.py --data /tmp/g2m --workers 2 --repeat 2
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def etl(*args: object) -> tuple[float, str]:
    """Run ``etl`` with ``args``; (wall seconds, stdout). Exits when the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "etl", *map(str, args)], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"etl {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return seconds, proc.stdout


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="Raw shards (etl generate ... --out DIR).")
    ap.add_argument("--pipeline", type=Path, default=REPO / "pipelines/criteo.yaml")
    ap.add_argument("--workers", type=int, default=2, help="Threads, and worker processes of the local cluster.")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="etl-bench-cluster-"))
    try:
        rows = None
        fit_wall, out = etl("fit", "--pipeline", a.pipeline, "--input", a.data, "--artifacts", work / "artifacts", "--workers", a.workers)
        m = re.search(r"on ([\d,]+) rows in ([\d.]+) s", out)
        if m:
            rows = int(m.group(1).replace(",", ""))
            print(f"fit: {rows:,} rows in {m.group(2)} s ({rows / float(m.group(2)):,.0f} rows/s; wall {fit_wall:.2f} s), {a.workers} threads")
        runs: dict[str, list[tuple[float, float]]] = {"threads": [], "cluster": []}
        reference = None
        for i in range(a.repeat):
            for how, option in (("threads", ["--workers", a.workers]), ("cluster", ["--cluster", f"local:{a.workers}"])):
                dest = work / f"{how}{i}"
                wall, out = etl("preprocess", "--pipeline", a.pipeline, "--input", a.data, "--out", dest, "--artifacts", work / "artifacts", *option)
                m = re.search(r"transform: ([\d,]+) rows in ([\d.]+) s", out)
                if m is None:
                    sys.exit(f"no transform line in:\n{out}")
                rows = int(m.group(1).replace(",", ""))
                runs[how].append((wall, float(m.group(2))))
                digest = tree_digest(dest)
                reference = reference or digest
                if digest != reference:
                    sys.exit(f"{dest}: the output differs from the first threaded run's")
                shutil.rmtree(dest)
                print(f"{how:8} run {i + 1}: wall {wall:6.2f} s, transform {float(m.group(2)):6.2f} s ({rows / float(m.group(2)):,.0f} rows/s)")
        med = {how: (statistics.median(w for w, _ in r), statistics.median(t for _, t in r)) for how, r in runs.items()}
        print(f"medians: threads wall {med['threads'][0]:.2f} s, transform {med['threads'][1]:.2f} s; "
              f"cluster wall {med['cluster'][0]:.2f} s, transform {med['cluster'][1]:.2f} s")  # fmt: skip
        print(f"cluster / threads: wall {med['cluster'][0] / med['threads'][0]:.2f}x, transform {med['cluster'][1] / med['threads'][1]:.2f}x; "
              "outputs byte-identical")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
