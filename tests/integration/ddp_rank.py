"""One rank of the torchrun test (``test_ddp.py``): joins the gloo process group that torchrun set up, reads its slice
of a data set (an s3:// URL) with the Loader, which takes its rank and world size from ``torch.distributed``, and
saves its rows and its batch count as ``<out>/rank<r>.npz``.

    python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_rank.py SOURCE PIPELINE OUT
"""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist

from etl.loader import Loader


def main() -> None:
    source, pipeline, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = Loader(source, pipeline, batch_size=64, shuffle=True, seed=5, num_workers=2)
    rows, batches = [], 0
    try:
        for b in loader:
            batches += 1
            rows.append(np.hstack([b.label.numpy()[:, None], b.dense.numpy(), b.sparse.numpy()]).astype(np.float64))
    finally:
        loader.close()
    counts: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(counts, batches)  # a collective: every rank gets here after the same number of steps
    np.savez(f"{out}/rank{rank}.npz", rows=np.concatenate(rows), batches=batches, counts=np.array(counts))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
