"""etl.bench.dlrm: the DLRM's shapes, id folding and training step."""

from __future__ import annotations

import torch

from etl.bench.dlrm import DLRM, mlp


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
