"""A small DLRM-style model: the consumer of ``scripts/train_dlrm.py`` and of ``etl bench --model``.

For a batch of ``dense`` features ``[B, D]`` (float32) and ``sparse`` ids ``[B, S]`` (any integer dtype):

- a bottom MLP ``D → 64 → dim`` (ReLU after each layer) on the dense features;
- one embedding table of ``table_rows[k]`` rows × ``dim`` per sparse column ``k``; an id is folded into its table
  with ``id % table_rows[k]``, so tables may be smaller than the column's cardinality;
- the pairwise dot products of the ``S + 1`` vectors (bottom output and embeddings), upper triangle without the
  diagonal;
- a top MLP ``dim + (S + 1)·S/2 → 64 → 1`` (ReLU between layers, none after the last) on the bottom output and
  the dot products, giving one logit per row ``[B]`` (train with ``BCEWithLogitsLoss`` on the label).
"""

from __future__ import annotations

import torch
from torch import nn


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
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in table_rows)
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
