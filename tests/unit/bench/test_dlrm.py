"""etl.bench.dlrm: the DLRM's shapes, id folding and training step; fresh rows for admitted online-vocabulary ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from etl import Loader
from etl.bench.dlrm import DLRM, mlp, reset_embedding_rows
from etl.io.parquet import list_shards
from etl.ops.online_vocab import VocabEvents
from etl.pipeline import Pipeline
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO


def test_mlp_layers() -> None:
    kinds = [type(m).__name__ for m in mlp([4, 8, 2], last_activation=False)]
    assert kinds == ["Linear", "ReLU", "Linear"]
    assert [type(m).__name__ for m in mlp([4, 8, 2], last_activation=True)] == kinds + ["ReLU"]


def test_one_logit_per_row_and_tables_of_the_given_rows() -> None:
    torch.manual_seed(0)
    model = DLRM(13, [5, 7, 11], 4)
    assert [t.num_embeddings for t in model.embeddings] == [5, 7, 11]
    assert model.top[0].in_features == 4 + 4 * 3 // 2  # bottom output + dot products of 4 vectors
    out = model(torch.rand(6, 13), torch.randint(0, 100, (6, 3), dtype=torch.int32))
    assert out.shape == (6,) and out.dtype == torch.float32


def test_ids_are_folded_into_their_table() -> None:
    torch.manual_seed(0)
    model = DLRM(2, [5, 7], 3)
    dense, ids = torch.rand(8, 2), torch.randint(0, 1000, (8, 2), dtype=torch.int64)
    folded = ids % torch.tensor([5, 7])
    assert torch.equal(model(dense, ids), model(dense, folded.to(torch.int32)))


def test_a_training_step_lowers_the_loss_on_its_batch() -> None:
    torch.manual_seed(0)
    model = DLRM(3, [10, 10], 4)
    dense, ids, label = torch.rand(64, 3), torch.randint(0, 10, (64, 2)), torch.randint(0, 2, (64,)).float()
    opt, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.BCEWithLogitsLoss()
    before = loss_fn(model(dense, ids), label)
    opt.zero_grad()
    before.backward()
    opt.step()
    assert loss_fn(model(dense, ids), label) < before


def test_table_rows_move_with_the_model_and_stay_out_of_its_state() -> None:
    """A buffer: ``model.to(device)`` moves it once (no host→device copy per forward pass); not saved in checkpoints."""
    model = DLRM(2, [5, 7], 3)
    assert any(b is model.table_rows for b in model.buffers())
    assert "table_rows" not in model.state_dict() and model.table_rows.tolist() == [5, 7]


def _events(admitted: list[int], evicted: list[int]) -> VocabEvents:
    return VocabEvents(np.array(admitted, np.int64), np.array(admitted, np.uint64), np.array(evicted, np.int64), np.array(evicted, np.uint64))


def test_admitted_ids_get_fresh_rows_and_optimizer_state() -> None:
    """A batch whose events admit ids 3 and 12 (12 folds onto row 2 of a 10-row table) in column "b": those rows of
    b's table and of its optimizer state change, nothing else does; evicted ids alone reset nothing."""
    torch.manual_seed(0)
    model = DLRM(2, [10, 10], 3)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    loss = model(torch.rand(16, 2), torch.randint(0, 10, (16, 2))).sum()
    loss.backward()
    opt.step()
    for table in model.embeddings:
        opt.state[table.weight]["sum"].fill_(5.0)
    before = [t.weight.detach().clone() for t in model.embeddings]
    n = reset_embedding_rows(model, opt, {"b": _events([3, 12], [7])}, ["a", "b"])
    assert n == 2
    after = [t.weight.detach() for t in model.embeddings]
    assert torch.equal(after[0], before[0])
    changed = (after[1] != before[1]).any(dim=1).nonzero().flatten().tolist()
    assert changed == [2, 3]
    state = opt.state[model.embeddings[1].weight]["sum"]
    assert state[[2, 3]].eq(0).all() and state[[0, 1, 4, 5, 6, 7, 8, 9]].eq(5).all()
    assert opt.state[model.embeddings[0].weight]["sum"].eq(5).all()
    assert reset_embedding_rows(model, opt, {"b": _events([], [4])}, ["a", "b"]) == 0
    assert torch.equal(model.embeddings[1].weight.detach()[4], before[1][4])


def test_the_events_of_an_online_loader_reset_their_rows(tmp_path: Path) -> None:
    """A (non-following) loader with an online vocabulary on C1, seeded with 3 ids of 8 by the fit: its first batch
    admits and evicts ids; resetting from its events changes exactly the rows of the ids it admitted."""
    generate(load_schema(REPO / "schemas/criteo.yaml"), 1500, 1, tmp_path / "raw", seed=1, cardinalities={"C1": 400})
    (tmp_path / "p.yaml").write_text(f"""name: online_hash
schema: {REPO / "schemas/criteo.yaml"}
ops:
  - {{op: FillMissing, columns: "@dense", value: 0}}
  - {{op: Decode, columns: "@categorical"}}
  - {{op: Hash, columns: {{role: categorical, exclude: [C1]}}, num_buckets: 1000, seed: 0}}
  - {{op: Categorify, columns: [C1], online: true, capacity: 8, admit_after: 2, max_size: 3, evict: lfu}}
""")
    pipeline = Pipeline.from_file(tmp_path / "p.yaml")
    pipeline.fit(list_shards(tmp_path / "raw"))
    pipeline.save(tmp_path / "art")
    loader = Loader(tmp_path / "raw", pipeline=tmp_path / "p.yaml", artifacts=tmp_path / "art", batch_size=256)
    batch = next(iter(loader))
    loader.close()
    admitted = batch.vocab_events["C1"].admitted_ids
    assert len(admitted) > 0 and len(batch.vocab_events["C1"].evicted_ids) > 0
    torch.manual_seed(0)
    names = list(loader.layout.sparse)
    model = DLRM(len(loader.layout.dense), [20] * len(names), 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    k = names.index("C1")
    before = model.embeddings[k].weight.detach().clone()
    assert reset_embedding_rows(model, opt, batch.vocab_events, names) == len(set(admitted.tolist()))
    changed = (model.embeddings[k].weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == sorted(set((admitted % 20).tolist()))
