"""One rank of the DDP test (tests/integration/test_ddp.py), started by torchrun: a gloo process group, a Loader
that takes its rank and world size from it, and a collective per batch, as a training step does.

Writes ``OUT/rank{RANK}.json``: the row numbers this rank saw (from dense[:, 0] = log1p(row), see test_loader.py),
its batch count, and the world's total of rows summed over the ranks with ``all_reduce``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from etl.loader import Loader


def main(source: str, pipeline: str, out: str, batch_size: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = Loader(source, pipeline=pipeline, batch_size=batch_size, shuffle=True, seed=7, shuffle_buffer=4_000)
    rows: list[int] = []
    seen = torch.zeros(1, dtype=torch.int64)
    batches = 0
    for batch in loader:
        rows.extend(np.rint(np.expm1(batch.dense[:, 0].double().numpy())).astype(np.int64).tolist())
        step = torch.tensor([len(batch.label)], dtype=torch.int64)
        dist.all_reduce(step)  # a rank with fewer batches than another would leave this collective hanging
        seen += step
        batches += 1
    loader.close()
    doc = {"rank": loader.rank, "world_size": loader.world_size, "rows": rows, "batches": batches, "world_rows": int(seen)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
