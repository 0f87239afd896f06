#!/usr/bin/env python3
"""A small DLRM-style model trained from ``etl.Loader``: the example of the loader inside a training loop.

Model: ``etl.bench.dlrm.DLRM``: one embedding table per sparse column (rows = the column's cardinality, capped by
``--max-emb-rows``; ids above the cap are folded with a modulo), a bottom MLP on the dense features, pairwise
dot-product interaction of the bottom output and the embeddings, a top MLP, binary cross-entropy on the label.
Every ``--log-every`` steps it prints samples/s and the share of time the loop waited for data.

    python scripts/train_dlrm.py --data /tmp/raw --pipeline pipelines/criteo_hash.yaml --steps 200
    python scripts/train_dlrm.py --data /tmp/processed --device cuda --batch-size 65536
    python scripts/train_dlrm.py --data /tmp/raw --pipeline pipelines/criteo_hash.yaml --device cuda --transform-on device
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import etl
from etl.bench.dlrm import DLRM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw shards, or the output of etl preprocess")
    ap.add_argument("--pipeline", type=Path, default=None, help="pipeline YAML (raw shards only)")
    ap.add_argument("--artifacts", type=Path, default=None, help="fitted artifacts (raw shards, fitted pipelines)")
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=100, help="stop after this many steps (0: one epoch)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--transform-on", choices=["host", "device"], default="host", help="where the pipeline's ops after decoding run (raw shards)")
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--max-emb-rows", type=int, default=100_000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--log-every", type=int, default=20)
    args = ap.parse_args()

    loader = etl.Loader(args.data, pipeline=args.pipeline, artifacts=args.artifacts, batch_size=args.batch_size,
                        shuffle=True, seed=0, device=args.device, num_workers=args.workers,
                        transform_on=args.transform_on)  # fmt: skip
    cards = loader.pipeline.cardinalities()
    model = DLRM(len(loader.layout.dense), [min(cards[c], args.max_emb_rows) for c in loader.layout.sparse], args.emb_dim).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    step, t_log, rows_log, wait_log = 0, time.perf_counter(), 0, 0.0
    for batch in loader:
        if len(batch) == 0:  # a rank's final empty batch in distributed runs
            continue
        loss = loss_fn(model(batch.dense, batch.sparse), batch.label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        rows_log += len(batch)
        if step % args.log_every == 0:
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            now = time.perf_counter()
            wait = loader.stats.wait_seconds - wait_log
            rate, waited = rows_log / (now - t_log), 100 * wait / (now - t_log)
            print(f"step {step:6d}  loss {loss.item():.4f}  {rate:12,.0f} samples/s  data wait {waited:5.1f} %", flush=True)
            t_log, rows_log, wait_log = now, 0, loader.stats.wait_seconds
        if args.steps and step >= args.steps:
            break
    loader.close()
    s = loader.stats
    print(f"done: {step} steps, {s.rows:,} rows, data wait {100 * s.data_wait_fraction:.1f} % of the loop")


if __name__ == "__main__":
    main()
