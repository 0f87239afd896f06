"""``LoaderBatch``: one batch as a loader hands it to the training loop, whatever its engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from etl.ops.online_vocab import VocabEvents


@dataclass
class LoaderBatch:
    """One batch: ``label`` [B] float32, ``dense`` [B, D] float32, ``sparse`` [B, S] ids (columns in the order of
    ``Loader.layout``), ``lists``: multi-hot columns as (values, offsets[B + 1]), ``sparse_names`` their names.

    Passthrough columns (schema role ``passthrough``, such as a row id) are not in loader batches: the loader does
    not read them from raw shards nor from a processed output. They serve the offline path: ``etl preprocess``
    writes them, unchanged, beside the transformed columns of each row.

    ``label``, ``dense`` and ``sparse`` are views of a ring slot that the loader reuses: the next batch (the next
    ``next()`` on the loader's iterator) overwrites them. Keep a batch by cloning its tensors, or build the loader
    with ``copy=True``, whose batches own their tensors. The ``lists`` tensors are made for each batch.

    ``vocab_events``: with online vocabularies (Categorify ``online: true``), one ``VocabEvents`` per online column
    (numpy arrays, in the order it happened: ``admitted_ids`` with ``admitted_keys``, ``evicted_ids`` with
    ``evicted_keys``; ids as ``sparse`` holds them): the ids given and taken back by this batch's rows, which get
    their ids in the batch's row order (``etl.loader.stream_state``). An id evicted in a batch is given again only in a
    later one, so within a batch an id names one key. Reset the embedding rows of ``admitted_ids`` before training
    on the batch: no row of an evicted key uses its id in or after the batch that admits the new key. Empty without
    online columns.

    Sequences (the list columns of a History op, ``etl.loader.sequences``): ``lengths``, per History op its lengths
    column (``hist_len``) → [B] int32, each row's history length (not in ``sparse`` nor ``to_kjt``); the lists are
    in ``lists`` as jagged values + offsets; with the loader's ``pad_to``, ``padded`` also gives each list column
    as [B, L] ids (``sparse``'s dtype): a row's latest ``min(length, L)`` entries, oldest first, the rest ``0`` (the
    padding id, ``etl.ids.PAD``), on the loader's ``pad_side``. ``lengths`` and ``padded`` are views of the ring
    slot, as ``sparse`` is."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sparse_names: list[str] = field(default_factory=list)
    vocab_events: dict[str, VocabEvents] = field(default_factory=dict)
    lengths: dict[str, torch.Tensor] = field(default_factory=dict)
    padded: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.label.shape[0]

    def to_kjt(self) -> Any:
        """The sparse and list columns as a TorchRec ``KeyedJaggedTensor`` (keys: sparse columns, then lists, the
        History lists among them as jagged features; values key-major). Needs torchrec installed."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as e:
            raise ImportError("LoaderBatch.to_kjt needs torchrec (pip install torchrec)") from e
        ids = self.sparse.long()
        values = [ids.t().reshape(-1)] + [v.long() for v, _ in self.lists.values()]
        lengths = [torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)]
        lengths += [(o[1:] - o[:-1]).to(torch.int32) for _, o in self.lists.values()]
        return KeyedJaggedTensor.from_lengths_sync(keys=self.sparse_names + list(self.lists), values=torch.cat(values), lengths=torch.cat(lengths))
