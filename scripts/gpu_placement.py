#!/usr/bin/env python3
"""Host placement versus device placement of the loader's transform, measured in one run (used by
scripts/gpu_check.sh; runs on CPU too, where "device" means the torch backend on CPU tensors).

For each pipeline (Categorify with fitted artifacts, Hash) and batch size, with both placements
(``Loader(transform_on="host" | "device")``), on the same shards:

- ``rows_per_second``: one shuffled epoch after a warm-up epoch, the consumer doing nothing;
- ``cpu_seconds_per_mrow``: this process's CPU time (all threads) per million rows in that epoch: what the cores
  spend to feed the accelerator;
- ``wait_4m``: the data-wait share of a consumer that takes ``batch / 4e6`` s per batch (a model consuming 4 M
  rows/s), over the second of two such epochs (what later epochs of a training run see; ``wait_4m_first_epoch``
  is the first);
- ``wait_dlrm``: the data-wait share of the DLRM of scripts/train_dlrm.py training on the batches;
- ``device_stages``: rows/s of each stage of the device part (``etl.bench.device``), Categorify and Hash on the
  device among them;
- with cudf importable on a CUDA device, runs with ``reader="cudf"`` (row groups decoded on the GPU, device
  placement) beside the others: every run records its ``reader``.

``--phase headline`` measures only Categorify at the first batch size, both placements (the figures wanted first);
``--phase rest`` everything else, added to the runs already in ``--json``; ``--phase all`` (default) both.

    python scripts/gpu_placement.py --data RAW --artifacts ART --device cuda --json OUT/placement.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from etl.bench.device import measure_device_stages
from etl.bench.run import dlrm_step, measure_stall, next_epoch
from etl.io.parquet import list_shards, read_rows
from etl.loader import Loader, cudf_columns
from etl.loader.order import row_groups
from etl.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[1]


def epoch(loader: Loader) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one pass over the next epoch, the batches ready on the device."""
    t0, c0 = time.perf_counter(), time.process_time()
    next_epoch(loader)
    if loader.device.type == "cuda":
        torch.cuda.synchronize(loader.device)
    return time.perf_counter() - t0, time.process_time() - c0


def measure(data: Path, pipeline: Path, artifacts: Path | None, batch_size: int, placement: str, device: str, workers: int, dlrm: bool,
            reader: str = "cpu") -> dict:  # fmt: skip
    loader = Loader(data, pipeline=pipeline, artifacts=artifacts, batch_size=batch_size, shuffle=True, seed=0,
                    device=device, num_workers=workers, transform_on=placement, reader=reader)  # fmt: skip
    epoch(loader)  # warm-up: page cache, kernels, vocabularies moved to the device
    seconds, cpu = epoch(loader)
    rows = loader.total_rows
    out = {"rows_per_second": rows / seconds, "cpu_seconds_per_mrow": 1e6 * cpu / rows}
    out["wait_4m_first_epoch"], _ = measure_stall(loader, batch_size / 4e6)
    out["wait_4m"], _ = measure_stall(loader, batch_size / 4e6)
    if dlrm:
        out["wait_dlrm"], _ = measure_stall(loader, 0.0, dlrm_step(loader))
    loader.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw Criteo-like shards")
    ap.add_argument("--artifacts", type=Path, required=True, help="artifacts of pipelines/criteo.yaml fitted on --data")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[65536, 262144])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--stage-groups", type=int, default=8, help="row groups held in memory for the device stages")
    ap.add_argument("--no-dlrm", action="store_true", help="skip the DLRM data-wait runs")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--phase", choices=("headline", "rest", "all"), default="all")
    args = ap.parse_args()

    pipelines = {"categorify": (REPO / "pipelines/criteo.yaml", args.artifacts), "hash": (REPO / "pipelines/criteo_hash.yaml", None)}
    groups = row_groups(list_shards(args.data))[: args.stage_groups]
    report: dict = {"device": args.device, "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                    "torch": torch.__version__, "workers": args.workers, "rows": sum(g.num_rows for g in row_groups(list_shards(args.data))),
                    "runs": [], "device_stages": {}}  # fmt: skip
    if args.phase == "rest" and args.json.is_file():
        report = json.loads(args.json.read_text())
    headline = ("categorify", args.batch_sizes[0])
    readers = [("host", "cpu"), ("device", "cpu")]
    cudf_missing = cudf_columns.unavailable(torch.device(args.device), Pipeline.from_file(pipelines["categorify"][0]).schema)
    report["cudf"] = cudf_missing or "measured"
    if cudf_missing is None:
        readers.append(("device", "cudf"))
    for name, (path, art) in pipelines.items():
        p = Pipeline.load(art) if art is not None else Pipeline.from_file(path)
        tables = [read_rows(g.path, p.schema.names, g.first_row, g.num_rows, g.index) for g in groups] if _in_phase(args.phase, False) else []
        stage_rows = sum(t.num_rows for t in tables)
        for bs in args.batch_sizes:
            runs = [(placement, reader) for placement, reader in readers if _in_phase(args.phase, (name, bs) == headline and reader == "cpu")]
            for placement, reader in runs:
                r = measure(args.data, path, art, bs, placement, args.device, args.workers, not args.no_dlrm, reader)
                report["runs"].append({"pipeline": name, "batch_size": bs, "placement": placement, "reader": reader, **r})
                print(json.dumps(report["runs"][-1]), flush=True)
            if _in_phase(args.phase, False):
                stages = measure_device_stages(p, tables, bs, torch.device(args.device))
                report["device_stages"][f"{name}/{bs}"] = {s: stage_rows / sec for s, sec in stages}
    args.json.write_text(json.dumps(report, indent=1))
    print_table(report)


def _in_phase(phase: str, headline: bool) -> bool:
    """Whether a measurement (one of the headline figures or not) belongs to ``phase``."""
    return phase == "all" or (phase == "headline") == headline


def print_table(report: dict) -> None:
    """The report as a short table (also printed last by scripts/gpu_check.sh)."""
    print(f"\n{report['device_name']}, torch {report['torch']}, {report['rows']:,} rows, {report['workers']} workers")
    print(f"{'pipeline':11s} {'batch':>7s} {'placement':9s} {'reader':6s} {'M rows/s':>9s} {'CPU s/Mrow':>10s} {'wait@4M/s':>9s} {'wait DLRM':>9s}")
    for r in report["runs"]:
        dl = f"{100 * r['wait_dlrm']:8.2f}%" if "wait_dlrm" in r else "        -"
        rate, cpu, wait = r["rows_per_second"] / 1e6, r["cpu_seconds_per_mrow"], 100 * r["wait_4m"]
        print(f"{r['pipeline']:11s} {r['batch_size']:7d} {r['placement']:9s} {r.get('reader', 'cpu'):6s} {rate:9.2f} {cpu:10.2f} {wait:8.2f}% {dl}")
    if report.get("cudf", "measured") != "measured":
        print(f"cudf reader not measured: {report['cudf']}")
    for key, st in report["device_stages"].items():
        ops = "  ".join(f"{s.removeprefix('dp:')}={v / 1e6:.1f}M" for s, v in st.items())
        print(f"device stages {key}: {ops}")


if __name__ == "__main__":
    main()
