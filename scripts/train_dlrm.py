#!/usr/bin/env python3
"""A small DLRM-style model trained from ``etl.Loader``: the example of the loader inside a training loop.

Model: ``etl.bench.dlrm.DLRM``: one embedding table per sparse column (rows = the column's cardinality, capped by
``--max-emb-rows``; ids above the cap are folded with a modulo), a bottom MLP on the dense features, pairwise
dot-product interaction of the bottom output and the embeddings, a top MLP, binary cross-entropy on the label.
Every ``--log-every`` steps it prints samples/s and the share of time the loop waited for data.

    python scripts/train_dlrm.py --data /tmp/raw --pipeline pipelines/criteo_hash.yaml --steps 200
    python scripts/train_dlrm.py --data /tmp/processed --device cuda --batch-size 65536
    python scripts/train_dlrm.py --data /tmp/raw --pipeline pipelines/criteo_hash.yaml --device cuda --transform-on device

Continuous training (``--follow``): the loader follows a directory of raw shards that a producer keeps filling
(``Loader(follow=True)``; ``scripts/produce_shards.py`` is such a producer) and training never ends by itself
(``--steps 0``) or stops after ``--steps`` steps counted across restarts:

    python scripts/produce_shards.py --out /tmp/stream --rate 0.5 &
    python scripts/train_dlrm.py --data /tmp/stream --pipeline pipelines/criteo_hash.yaml --follow --steps 0 \\
        --checkpoint /tmp/ckpt/train.pt --resume

(``produce_shards.py --manifest`` and ``train_dlrm.py --arrivals manifest``: the shards in the order the producer
lists them in ``_arrivals.json``.)

Checkpoints (``--checkpoint FILE``): every ``--checkpoint-every`` steps, and after a short batch (the stream went
quiet), the model, the optimizer and the loader's ``state_dict`` are saved together in one file, written under a
temporary name and renamed, so a checkpoint is whole or absent. ``--resume`` starts from it: the loader continues
after the last batch the checkpoint counts, so after a kill -9 and a restart no row is lost or trained twice
(the batches trained after the last checkpoint are trained again, as their steps were lost with the process).

``--trace-column NAME``: the values of dense column NAME of every trained row (as the batch holds them, after the
pipeline's ops) are appended to ``FILE.trace``, one per line, before each checkpoint, and the checkpoint records
the trace's length: the first ``trace_bytes`` bytes of the trace are the rows the checkpoint has trained on
(a restart cuts the rest). ``scripts/produce_shards.py`` writes a row id in column I1 for this.

Evaluation (``--valid DIR``): after training, the model scores every row of ``DIR`` (the output of etl preprocess,
such as the ``valid`` split of ``etl preprocess --split``: rows later than the training rows, encoded with the
statistics of the training rows only) and prints its AUC and log loss there, and those of the training rows seen
in the last ``--log-every`` steps. ``--label-threshold T`` trains on ``label >= T`` (e.g. a rating of 4 or more)
instead of the label itself:

    etl preprocess --pipeline pipelines/movielens_target.yaml --input data/ml/raw --out data/ml/split \
        --split '{by: time, column: timestamp, train_until: {quantile: 0.8}, valid_until: {quantile: 0.9}}'
    python scripts/train_dlrm.py --data data/ml/split/train --valid data/ml/split/valid --label-threshold 4 --steps 0

Online vocabularies (Categorify ``online: true``): before the step on a batch, the embedding rows of the ids its
``vocab_events`` admit (new ids, and ids reused after an eviction) are reset with their optimizer state
(``etl.bench.dlrm.reset_embedding_rows``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import etl
from etl.bench.dlrm import DLRM, reset_embedding_rows
from etl.bench.metrics import auc, log_loss


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file in the same directory, flushed, then renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_trace(path: Path, values: list[float]) -> int:
    """Append ``values`` to the trace at ``path``, one per line, durably; the trace's length in bytes after it."""
    with open(path, "ab") as f:
        f.write("".join(f"{v!r}\n" for v in values).encode())
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def target(label: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """The training target of a batch: its label, or ``label >= threshold`` as 0/1."""
    return label if threshold is None else (label >= threshold).float()


@torch.no_grad()
def evaluate(model: DLRM, data: Path, batch_size: int, device: str, threshold: float | None) -> tuple[float, float, int]:
    """AUC, log loss and rows of ``model`` on every row of the processed output ``data``."""
    model.eval()
    loader = etl.Loader(data, batch_size=batch_size, shuffle=False, drop_last=False, device=device)
    ys, ps = [], []
    for batch in loader:
        ys.append(target(batch.label, threshold).cpu().numpy())
        ps.append(torch.sigmoid(model(batch.dense, batch.sparse)).cpu().numpy())
    loader.close()
    model.train()
    y, p = np.concatenate(ys), np.concatenate(ps)
    return auc(y, p), log_loss(y, p), len(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="raw shards, or the output of etl preprocess")
    ap.add_argument("--pipeline", type=Path, default=None, help="pipeline YAML (raw shards only)")
    ap.add_argument("--artifacts", type=Path, default=None, help="fitted artifacts (raw shards, fitted pipelines)")
    ap.add_argument("--batch-size", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=100,
                    help="stop after this many steps, counted across restarts (0: --epochs epochs; with --follow, never)")  # fmt: skip
    ap.add_argument("--epochs", type=int, default=1, help="with --steps 0: passes over the data (not with --follow)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--transform-on", choices=["host", "device"], default="host", help="where the pipeline's ops after decoding run (raw shards)")
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--max-emb-rows", type=int, default=100_000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model's initial weights")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--follow", action="store_true", help="follow a directory of raw shards that a producer keeps filling")
    ap.add_argument("--poll-interval", type=float, default=1.0, help="--follow: seconds between looks at the directory")
    ap.add_argument("--arrivals", choices=["names", "manifest"], default="names",
                    help="--follow: the arrival order: by name, or as the producer lists the shards in _arrivals.json")  # fmt: skip
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (model, optimizer, loader state)")
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--resume", action="store_true", help="start from --checkpoint when it exists")
    ap.add_argument("--trace-column", default=None, help="log this dense column's value of every trained row with each checkpoint")
    ap.add_argument("--valid", type=Path, default=None, help="after training, AUC and log loss on this output of etl preprocess")
    ap.add_argument("--label-threshold", type=float, default=None, help="train on label >= this value (0/1) instead of the label")
    args = ap.parse_args()
    if (args.resume or args.trace_column) and args.checkpoint is None:
        ap.error("--resume and --trace-column need --checkpoint")
    if args.epochs != 1 and args.follow:
        ap.error("--epochs goes without --follow")
    if args.arrivals != "names" and not args.follow:
        ap.error("--arrivals goes with --follow")
    if args.checkpoint is not None:
        args.checkpoint.parent.mkdir(parents=True, exist_ok=True)

    loader = etl.Loader(args.data, pipeline=args.pipeline, artifacts=args.artifacts, batch_size=args.batch_size,
                        shuffle=True, seed=0, device=args.device, num_workers=args.workers,
                        transform_on=args.transform_on, follow=args.follow, poll_interval=args.poll_interval, arrivals=args.arrivals)  # fmt: skip
    torch.manual_seed(args.seed)
    cards = loader.pipeline.cardinalities()
    sparse_names = list(loader.layout.sparse)
    model = DLRM(len(loader.layout.dense), [min(cards[c], args.max_emb_rows) for c in sparse_names], args.emb_dim).to(args.device)
    opt = (torch.optim.SGD if args.optimizer == "sgd" else torch.optim.Adam)(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    trace_path = None if args.checkpoint is None else args.checkpoint.with_name(args.checkpoint.name + ".trace")
    trace_col = None if args.trace_column is None else list(loader.layout.dense).index(args.trace_column)

    step, trace_bytes = 0, 0
    if args.resume and args.checkpoint is not None and args.checkpoint.exists():
        saved = torch.load(args.checkpoint, map_location=args.device, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step, trace_bytes = saved["step"], saved["trace_bytes"]
        print(f"resumed from {args.checkpoint} at step {step}", flush=True)
    if trace_path is not None and trace_col is not None:
        with open(trace_path, "ab") as f:
            f.truncate(trace_bytes)  # rows traced after the checkpoint were not trained as far as it knows
    pending: list[float] = []  # traced values of the rows trained since the last checkpoint

    def checkpoint() -> None:
        nonlocal trace_bytes, pending
        if args.checkpoint is None:
            return
        if trace_path is not None and trace_col is not None:
            trace_bytes = append_trace(trace_path, pending)
            pending = []
        save_checkpoint(args.checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict(),
                                          "step": step, "trace_bytes": trace_bytes})  # fmt: skip

    t_log, rows_log, wait_log = time.perf_counter(), 0, 0.0
    recent: list[tuple[np.ndarray, np.ndarray]] = []  # (targets, probabilities) of the last --log-every batches
    def batches() -> Iterator[etl.LoaderBatch]:
        """The batches of ``--epochs`` epochs (one pass of a followed directory)."""
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            yield from loader

    for batch in batches():
        if len(batch) == 0:  # a rank's final empty batch in distributed runs
            continue
        if batch.vocab_events:
            reset_embedding_rows(model, opt, batch.vocab_events, sparse_names)
        logits = model(batch.dense, batch.sparse)
        y = target(batch.label, args.label_threshold)
        loss = loss_fn(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        rows_log += len(batch)
        if args.valid is not None:
            recent.append((y.detach().cpu().numpy(), torch.sigmoid(logits).detach().cpu().numpy()))
            del recent[: -args.log_every]
        if trace_col is not None:
            pending.extend(batch.dense[:, trace_col].tolist())
        if step % args.checkpoint_every == 0 or len(batch) < args.batch_size:
            checkpoint()
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
    checkpoint()
    loader.close()
    s = loader.stats
    print(f"done: {step} steps, {s.rows:,} rows, data wait {100 * s.data_wait_fraction:.1f} % of the loop")
    if args.valid is not None:
        y, p = (np.concatenate(a) for a in zip(*recent))
        print(f"train (last {len(recent)} batches, {len(y):,} rows): AUC {auc(y, p):.4f}  log loss {log_loss(y, p):.4f}")
        a, ll, rows = evaluate(model, args.valid, args.batch_size, args.device, args.label_threshold)
        print(f"valid ({args.valid}, {rows:,} rows): AUC {a:.4f}  log loss {ll:.4f}")


if __name__ == "__main__":
    main()
