#!/usr/bin/env python3
"""A small next-item model (SASRec-like) trained on user histories made by the ``History`` op, read by ``etl.Loader``.

Data: the output of ``etl preprocess`` with a History op: per row, the item (``--item``), the time (``--time``, a dense
column) and the ids of the user's earlier items (``--history``, a list, oldest first). With MovieLens:

    etl convert ml-latest-small/ratings.csv --join ml-latest-small/movies.csv --on movieId \\
        --schema schemas/movielens.yaml --out data/ml/raw
    etl preprocess --pipeline pipelines/movielens_sequence.yaml --input data/ml/raw --out data/ml/sequences
    python scripts/train_sequential.py --data data/ml/sequences

and on synthetic events (``--item item_id --history hist_item_id``, after ``etl generate --schema
schemas/events.yaml`` and ``etl preprocess --pipeline pipelines/events_sequence.yaml``).

Split by time, without leakage: the rows are ordered by the time column as the batches hold it (the pipeline may
standardise it: Normalize, float32 rounding included, never puts a later time before an earlier one, so a row below
the split's value is strictly earlier than every row at or above it; the dates printed are exact to float32's
precision, about 30 s on MovieLens); the latest ``--test-share`` of the rows is
the test window, the rows strictly before its first time the training window (``--train-rows N``: only its latest
N rows). So every training event is strictly earlier than every test event; a row's history holds only events
strictly earlier than the row (History's rule), which for a test row may include earlier test-window events, as
they would be known when predicting it. The model's items are the items of the training window (an item first seen
in the test window is unknown to every ranker: a miss); the most-popular baseline counts the training window only.

Model: item and position embeddings of the latest ``--max-len`` items of the history (left-padded: a small local
function turns the loader's values and offsets into a padded [B, L] tensor), ``--blocks`` transformer blocks (self-attention over the
history's items, padding masked), and the output at the last position scored against every item's embedding (shared
with the input); softmax cross-entropy on the row's item. An empty history reads the padding's position only, so it
learns a popularity-like answer.

Evaluation on the test window: the rank of the row's item among the training window's items, the items of the row's
whole history (History's list) left out (``--keep-seen`` keeps them), ties in score broken at random in expectation; HR@10 (the item in the
top 10) and NDCG@10, for the model, the most-popular ranker and a random ranker (expected values).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

import etl
from etl.pipeline import Pipeline

PAD, UNKNOWN = 0, 1  # model indices; the training window's items are 2, 3, ...
K = 10


class Block(nn.Module):
    """Pre-norm transformer block: self-attention over the positions kept, then a feed-forward layer."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, ignore: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=ignore, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class NextItem(nn.Module):
    """SASRec-like: the history's item + position embeddings through transformer blocks; the last position's output
    scores every item by a dot product with its (shared) embedding."""

    def __init__(self, items: int, max_len: int, dim: int, blocks: int, heads: int, dropout: float):
        super().__init__()
        self.item = nn.Embedding(items, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        nn.init.normal_(self.item.weight, std=0.02)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        """[B, L] model indices (left-padded) → [B, items] scores (padding and unknown at -inf)."""
        ignore = seq == PAD
        ignore[:, -1] = False  # an empty history still reads its last position
        x = self.drop(self.item(seq) + self.pos) * (~ignore).unsqueeze(-1)
        for block in self.blocks:
            x = block(x, ignore)
        scores = self.norm(x[:, -1]) @ self.item.weight.T
        scores[:, [PAD, UNKNOWN]] = -math.inf
        return scores


def expected_hits(scores: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: HR@K and NDCG@K of ``target`` (a column of ``scores``; UNKNOWN: a miss), ties broken at random in
    expectation (the target is equally likely at each place among the items of its score)."""
    t = scores.gather(1, target.unsqueeze(1))
    above = (scores > t).sum(1)
    tied = (scores == t).sum(1) - 1
    places = torch.arange(K).unsqueeze(0)  # 0-based places in the top K
    at = (places >= above.unsqueeze(1)) & (places <= (above + tied).unsqueeze(1))
    share = at.float() / (tied + 1).unsqueeze(1).float()
    known = (target != UNKNOWN).float()
    return share.sum(1) * known, (share / torch.log2(places + 2.0)).sum(1) * known


def read_columns(data: Path, item: str, history: str, time_col: str) -> tuple[np.ndarray, np.ndarray]:
    """Every row's item id and time (as the batches hold them), in the loader's order."""
    items, times = [], []
    loader = etl.Loader(data, batch_size=65_536, num_workers=1)
    layout = loader.layout
    for name, names in ((item, layout.sparse), (time_col, layout.dense), (history, layout.lists)):
        if name not in names:
            raise SystemExit(f"{data}: no column {name!r} among {names} (see --item, --time, --history)")
    i, t = layout.sparse.index(item), layout.dense.index(time_col)
    for b in loader:
        items.append(b.sparse[:, i].numpy().astype(np.int64))
        times.append(b.dense[:, t].numpy().copy())
    return np.concatenate(items), np.concatenate(times)


def time_scale(pipeline: Pipeline, time_col: str) -> tuple[float, float] | None:
    """(mean, std) when the pipeline standardises the time (Normalize, its only op on it), None when it does not touch
    it; SystemExit when another op changes it (its order would not be the raw times')."""
    ops = [op for op in pipeline.ops if time_col in op.columns and op.name != "History"]
    if not ops:
        return None
    if len(ops) == 1 and ops[0].name == "Normalize":
        return ops[0].mean[time_col], ops[0].std[time_col]  # type: ignore[attr-defined]
    raise SystemExit(f"{time_col}: the pipeline applies {[op.name for op in ops]} to it; splitting by time needs the raw time or Normalize")


def batches(loader: etl.Loader, lo: float, hi: float, item: str, history: str, time_col: str, remap: torch.Tensor):
    """The rows with ``lo <= time < hi`` of each loader batch (its histories padded on the left by the loader's
    ``pad_to``), as model indices: (the padded histories, targets, the whole histories as (row, item) pairs)."""
    i, t = loader.layout.sparse.index(item), loader.layout.dense.index(time_col)
    for b in loader:
        keep = (b.dense[:, t] >= lo) & (b.dense[:, t] < hi)
        if keep.any():
            values, offsets = b.lists[history]
            row = torch.repeat_interleave(torch.arange(len(keep)), offsets[1:] - offsets[:-1])
            kept = keep[row]
            seen = ((torch.cumsum(keep, 0) - 1)[row[kept]], remap[values[kept].long()])
            yield remap[b.padded[history][keep].long()], remap[b.sparse[keep, i].long()], seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="output of etl preprocess with a History op")
    ap.add_argument("--item", default="movieId", help="the item column (a sparse id column)")
    ap.add_argument("--history", default="hist_movieId", help="History's list of the item column")
    ap.add_argument("--time", default="timestamp", help="the time column (dense: raw or Normalize'd)")
    ap.add_argument("--test-share", type=float, default=0.1, help="the latest share of the rows, by time, to evaluate on")
    ap.add_argument("--train-rows", type=int, default=0, help="train on the latest N rows before the test window only (0: all)")
    ap.add_argument("--max-len", type=int, default=20, help="the model reads the latest N items of each history (padded)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the loader's threads use another core)")
    ap.add_argument("--keep-seen", action="store_true", help="rank the items of the row's history too")
    ap.add_argument("--metrics-json", type=Path, default=None, help="write the metrics there as JSON")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    items, times = read_columns(args.data, args.item, args.history, args.time)
    if not 0 < args.test_share < 1 or len(times) < 2:
        raise SystemExit("need --test-share in (0, 1) and at least 2 rows")
    ordered = np.sort(times)
    split = ordered[min(int(len(times) * (1 - args.test_share)), len(times) - 1)]
    before = ordered[ordered < split]
    if len(before) == 0:
        raise SystemExit(f"no row is earlier than the test window's first time {split}: lower --test-share")
    start = before[-args.train_rows] if 0 < args.train_rows < len(before) else before[0]
    start, split = float(start), float(split)
    train, test = (times >= start) & (times < split), times >= split
    pipeline = Pipeline.load(args.data / "artifacts")
    counts = np.bincount(items[train], minlength=pipeline.cardinalities()[args.item])  # by id of the item column
    vocab = np.flatnonzero(counts)  # the training window's item ids
    remap = torch.full((len(counts),), UNKNOWN, dtype=torch.int64)
    remap[PAD] = PAD
    remap[torch.from_numpy(vocab)] = torch.arange(2, 2 + len(vocab))
    popular = torch.full((2 + len(vocab),), -math.inf)
    popular[2:] = torch.from_numpy(counts[vocab]).float()

    scale = time_scale(pipeline, args.time)

    def when(x: float) -> str:
        return datetime.fromtimestamp(round(x * scale[1] + scale[0]), UTC).strftime("%Y-%m-%d %H:%M:%S") if scale else f"{x:.6g}"

    unseen = float(np.mean(counts[items[test]] == 0))
    print(f"rows: {len(times):,}; training window: {int(train.sum()):,} rows [{when(start)}, {when(split)}); "
          f"test window: {int(test.sum()):,} rows [{when(split)}, {when(ordered[-1])}]")
    print(f"items: {len(vocab):,} in the training window; test rows whose item it lacks: {unseen:.1%}")

    model = NextItem(2 + len(vocab), args.max_len, args.dim, args.blocks, args.heads, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = etl.Loader(args.data, batch_size=args.batch_size, shuffle=True, seed=args.seed, shuffle_buffer=1 << 18, num_workers=1,
                        pad_to=args.max_len, pad_side="left")
    for epoch in range(args.epochs):
        model.train()
        loader.set_epoch(epoch)
        t0, total, n = time.perf_counter(), 0.0, 0
        for seq, target, _ in batches(loader, start, split, args.item, args.history, args.time, remap):
            loss = nn.functional.cross_entropy(model(seq), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(target), n + len(target)
        print(f"epoch {epoch + 1}: loss {total / max(n, 1):.4f} on {n:,} rows, {time.perf_counter() - t0:.1f} s")

    model.eval()
    sums = {name: torch.zeros(2) for name in ("model", "most popular", "random")}
    rows = 0
    evaluation = etl.Loader(args.data, batch_size=1024, num_workers=1, pad_to=args.max_len, pad_side="left")
    with torch.no_grad():
        for seq, target, seen in batches(evaluation, split, math.inf, args.item, args.history, args.time, remap):
            rankers = {"model": model(seq), "most popular": popular.expand(len(target), -1).clone(),
                       "random": torch.zeros(len(target), len(popular)).index_fill_(1, torch.tensor([PAD, UNKNOWN]), -math.inf)}
            for name, scores in rankers.items():
                if not args.keep_seen:
                    scores[seen] = -math.inf  # the items of the row's whole history (its list, not only --max-len)
                hr, ndcg = expected_hits(scores, target)
                sums[name] += torch.stack([hr.sum(), ndcg.sum()])
            rows += len(target)
    metrics = {name: {f"HR@{K}": float(s[0]) / rows, f"NDCG@{K}": float(s[1]) / rows} for name, s in sums.items()}
    print(f"test window, {rows:,} rows ({'history items kept' if args.keep_seen else 'history items left out'}):")
    for name, m in metrics.items():
        print(f"  {name:<13} HR@{K} {m[f'HR@{K}']:.4f}   NDCG@{K} {m[f'NDCG@{K}']:.4f}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    if args.metrics_json is not None:
        args.metrics_json.write_text(json.dumps({"rows": rows, "metrics": metrics}, indent=1))


if __name__ == "__main__":
    main()
