#!/usr/bin/env python3
"""`etl preprocess` in threads against `etl preprocess --cluster local:N`, in one run, on the same files.

Fits the pipeline once (`etl fit`, timed: the fit's per-core rate), then runs `etl preprocess --artifacts ...`
alternately in ``--workers N`` threads and on ``--cluster local:N`` (``--repeat`` times each, a fresh output
directory every time), as a user runs them. For each run it records the wall time of the command (interpreter
start, cluster start and stop included), the CPU time of its processes (user + system, worker processes included:
what decides the wall time on a machine whose cores are all busy) and the transform time the command reports
(shards only), and checks that
every output file is byte-identical to the first threaded run's. Prints a table and the ratios of the best runs
(and of the medians). Then, in a fresh interpreter of its own, times the phases of a fresh cluster run one by one
(``--phases``): the cluster's start (worker processes importing etl in their preload), loading the pipeline in
the driver and in each worker, the transform (the workers loading the pipeline again in their first task, as in
every run) and the cluster's shutdown.

    python scripts/bench_cluster.py --data /tmp/g2m --workers 2 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def etl(*args: object) -> tuple[float, float, str]:
    """Run ``etl`` with ``args``; (wall seconds, CPU seconds of its processes, stdout). Exits when it fails."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "etl", *map(str, args)], capture_output=True, text=True)
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"etl {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return seconds, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, proc.stdout


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def phases(data: Path, artifacts: Path, workers: int) -> None:
    """Print the seconds of each phase of a fresh ``--cluster local:N`` run, in this process (see the docstring)."""
    from etl.io.parquet import list_shards
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess
    from etl.runtime.cluster import connect

    def load(where: Path) -> float:
        t = time.perf_counter()
        Pipeline.load(where)
        return time.perf_counter() - t

    shards = list_shards([data])
    work = Path(tempfile.mkdtemp(prefix="etl-bench-phases-"))
    try:
        t0 = time.perf_counter()
        with connect(f"local:{workers}") as client:
            assert client is not None
            t1 = time.perf_counter()
            on_workers = sorted(client.run(load, artifacts).values())
            t2 = time.perf_counter()
            fitted = Pipeline.load(artifacts)
            t3 = time.perf_counter()
            summary = preprocess(fitted, shards, work / "out", client=client)
            t4 = time.perf_counter()
        t5 = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"phases, local:{workers} (s): cluster start {t1 - t0:.2f}; pipeline load on the workers {t2 - t1:.2f} "
          f"(each: {', '.join(f'{s:.2f}' for s in on_workers)}); in the driver {t3 - t2:.2f}; "
          f"transform {summary.transform_seconds:.2f} (run {t4 - t3:.2f}); shutdown {t5 - t4:.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="Raw shards (etl generate ... --out DIR).")
    ap.add_argument("--pipeline", type=Path, default=REPO / "pipelines/criteo.yaml")
    ap.add_argument("--workers", type=int, default=2, help="Threads, and worker processes of the local cluster.")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--phases", type=Path, metavar="ARTIFACTS", help="Only time the phases of a cluster run with these artifacts.")
    a = ap.parse_args()
    if a.phases is not None:
        phases(a.data, a.phases, a.workers)
        return
    work = Path(tempfile.mkdtemp(prefix="etl-bench-cluster-"))
    try:
        rows = None
        fit_wall, _, out = etl("fit", "--pipeline", a.pipeline, "--input", a.data, "--artifacts", work / "artifacts", "--workers", a.workers)
        m = re.search(r"on ([\d,]+) rows in ([\d.]+) s", out)
        if m:
            rows = int(m.group(1).replace(",", ""))
            print(f"fit: {rows:,} rows in {m.group(2)} s ({rows / float(m.group(2)):,.0f} rows/s; wall {fit_wall:.2f} s), {a.workers} threads")
        runs: dict[str, list[tuple[float, float]]] = {"threads": [], "cluster": []}
        reference = None
        for i in range(a.repeat):
            for how, option in (("threads", ["--workers", a.workers]), ("cluster", ["--cluster", f"local:{a.workers}"])):
                dest = work / f"{how}{i}"
                args = ("--pipeline", a.pipeline, "--input", a.data, "--out", dest, "--artifacts", work / "artifacts", *option)
                wall, cpu, out = etl("preprocess", *args)
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
                print(f"{how:8} run {i + 1}: wall {wall:6.2f} s, transform {float(m.group(2)):6.2f} s ({rows / float(m.group(2)):,.0f} rows/s), "
                      f"CPU {cpu:6.2f} s")  # fmt: skip
        for name, pick in (("best", min), ("median", statistics.median)):
            by = {how: (pick(w for w, _ in r), pick(t for _, t in r)) for how, r in runs.items()}
            (tw, tt), (cw, ct) = by["threads"], by["cluster"]
            print(f"{name}: threads wall {tw:.2f} s, transform {tt:.2f} s; cluster wall {cw:.2f} s, transform {ct:.2f} s; "
                  f"cluster / threads: wall {cw / tw:.2f}x, transform {ct / tt:.2f}x")  # fmt: skip
        print("outputs byte-identical")
        script = [sys.executable, __file__, "--data", a.data, "--workers", a.workers, "--phases", work / "artifacts"]
        subprocess.run(list(map(str, script)), check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
