"""A small DLRM-style model: the consumer of ``scripts/train_dlrm.py`` and of ``etl bench --model``.

For a batch of ``dense`` features ``[B, D]`` (float32) and ``sparse`` ids ``[B, S]`` (any integer dtype):

- a bottom MLP ``D → 64 → dim`` (ReLU after each layer) on the dense features;
- one embedding table of ``table_rows[k]`` rows × ``dim`` per sparse column ``k`` (initialised uniformly within
  ``±1/sqrt(table_rows[k])``); an id is folded into its table with ``id % table_rows[k]``, so tables may be smaller
  than the column's cardinality;
- the pairwise dot products of the ``S + 1`` vectors (bottom output and embeddings), upper triangle without the
  diagonal;
- a top MLP ``dim + (S + 1)·S/2 → 64 → 1`` (ReLU between layers, none after the last) on the bottom output and
  the dot products, giving one logit per row ``[B]`` (train with ``BCEWithLogitsLoss`` on the label).

``reset_embedding_rows``: with online vocabularies, the rows of newly admitted ids start fresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
from torch import nn

from etl.ops.online_vocab import VocabEvents


def mlp(sizes: list[int], last_activation: bool) -> nn.Sequential:
    """Linear layers ``sizes[0] → sizes[1] → …``, a ReLU after each but the last (after the last too with
    ``last_activation``)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """The model of the module docstring: ``dense`` features, one table of ``table_rows[k]`` rows per sparse
    column, embeddings of width ``dim``."""

    pairs_i: torch.Tensor  # the feature pairs (i < j) whose dot products enter the top MLP (buffers)
    pairs_j: torch.Tensor
    table_rows: torch.Tensor  # rows of each table (a buffer: it moves with the model, no copy per forward pass)

    def __init__(self, dense: int, table_rows: list[int], dim: int):
        super().__init__()
        self.register_buffer("table_rows", torch.tensor(table_rows), persistent=False)
        tables = [nn.Embedding(n, dim) for n in table_rows]
        for n, table in zip(table_rows, tables):
            nn.init.uniform_(table.weight, -(n**-0.5), n**-0.5)  # DLRM's own: small dot products at the start
        self.embeddings = nn.ModuleList(tables)
        self.bottom = mlp([dense, 64, dim], last_activation=True)
        features = len(table_rows) + 1
        self.top = mlp([dim + features * (features - 1) // 2, 64, 1], last_activation=False)
        rows, cols = torch.triu_indices(features, features, offset=1)
        self.register_buffer("pairs_i", rows, persistent=False)
        self.register_buffer("pairs_j", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of a batch: ``dense`` ``[B, D]`` float32, ``sparse`` ``[B, S]`` ids."""
        x = self.bottom(dense)
        ids = sparse.long() % self.table_rows
        embs = [x] + [table(ids[:, k]) for k, table in enumerate(self.embeddings)]
        z = torch.stack(embs, dim=1)  # [B, F, dim]
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs_i, self.pairs_j]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def reset_embedding_rows(model: DLRM, optimizer: torch.optim.Optimizer, events: Mapping[str, VocabEvents], sparse_names: list[str]) -> int:
    """Give the ids admitted into online vocabularies (``LoaderBatch.vocab_events``) fresh embedding rows, before the
    step that trains on their batch: for each online column, the rows of its ``admitted_ids`` (folded into the
    table as ``forward`` folds them) are drawn again from ``nn.Embedding``'s initial distribution (normal, 0, 1) and
    every optimizer state tensor of the table's shape (momentum, Adagrad or Adam sums) is zeroed on those rows.

    Only admitted ids are reset: an id reused after an eviction is always admitted again (``VocabEvents``), so it
    starts fresh then, and an evicted id is used by no row until that happens. With a table smaller than the
    column's capacity, the rows an admitted id shares with other ids are reset too. Returns the number of rows
    reset."""
    reset = 0
    for name, ev in events.items():
        if len(ev.admitted_ids) == 0:
            continue
        k = sparse_names.index(name)
        table = cast(nn.Embedding, model.embeddings[k]).weight
        rows = torch.unique(torch.as_tensor(ev.admitted_ids, dtype=torch.long) % table.shape[0]).to(table.device)
        with torch.no_grad():
            table[rows] = torch.randn(len(rows), table.shape[1], dtype=table.dtype, device=table.device)
            for value in optimizer.state.get(table, {}).values():
                if isinstance(value, torch.Tensor) and value.shape == table.shape:
                    value[rows] = 0
        reset += len(rows)
    return reset
