#!/usr/bin/env python3
"""No host synchronisation on the device path: one loader epoch with device placement under
``torch.cuda.set_sync_debug_mode("error")`` (used by scripts/gpu_check.sh).

A warm-up epoch first makes the constants and vocabularies resident on the device (a one-time wait each) and fills
the pinned-memory cache; then every batch of the next epoch is read, assembled, copied and transformed by the
loader's threads and handed to this consumer while torch raises on any operation that makes the host wait for the
GPU (``.item()``, ``.tolist()``, a blocking copy, a stream synchronisation). Such an error ends the check with the
operation and the line of the repository that called it. Waiting on an event (the ring's slots, the non-finite
flag the consumer examines) is the loader's design and is not an error there.

On a machine without CUDA the check is skipped, and says so.

    python scripts/gpu_sync_check.py --data RAW --artifacts ART --device cuda
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import torch

from etl.bench.run import next_epoch
from etl.loader import Loader

REPO = Path(__file__).resolve().parents[1]


def culprit(error: BaseException) -> str:
    """The repository line that called the synchronising operation (the innermost frame under etl/), and the
    operation's own frame."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(REPO / "etl")]
    where = ours[-1] if ours else frames[-1]
    return f"{Path(where.filename).resolve().relative_to(REPO) if ours else where.filename}:{where.lineno} in {where.name}: {where.line}"


def check(data: Path, artifacts: Path, batch_size: int, workers: int) -> int:
    """Run the check on CUDA; the process's exit code."""
    loader = Loader(data, pipeline=REPO / "pipelines/criteo.yaml", artifacts=artifacts, batch_size=batch_size, shuffle=True,
                    device="cuda", num_workers=workers, transform_on="device")  # fmt: skip
    try:
        next_epoch(loader)  # warm-up
        torch.cuda.synchronize()
        loader.set_epoch(loader.epoch + 1)
        batches = iter(loader)  # (starting a pass gives back its slots, which waits for the GPU once)
        count = 0
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in batches:
                count += 1
        except RuntimeError as e:
            if "synchroniz" not in str(e):
                raise
            print(f"sync check FAILED: the device path synchronised with the host: {culprit(e)}\n  ({e})")
            return 1
        finally:
            torch.cuda.set_sync_debug_mode(0)
        print(f"sync check: {count} batches of an epoch with device placement, no host synchronisation")
        return 0
    finally:
        loader.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw Criteo-like shards")
    ap.add_argument("--artifacts", type=Path, required=True, help="artifacts of pipelines/criteo.yaml fitted on --data")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    if not args.device.startswith("cuda"):
        print(f"sync check: skipped on device {args.device!r}: host synchronisation is a CUDA notion")
        return
    sys.exit(check(args.data, args.artifacts, args.batch_size, args.workers))


if __name__ == "__main__":
    main()
