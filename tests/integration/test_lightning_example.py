"""examples/lightning_datamodule.py under Lightning (skipped without lightning): the loaders go in as they are, every
training epoch reads the loader's epoch of that number, every validation run the whole validation set, and a run
resumed from a checkpoint trains on the batches an uninterrupted run trains on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from etl.loader import Loader, LoaderBatch
from etl.pipeline import Pipeline
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO

L = pytest.importorskip("lightning")

PIPELINE = REPO / "pipelines/criteo.yaml"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lightning_datamodule", REPO / "examples/lightning_datamodule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lightning")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 3000, 2, root / "train", seed=1)
    generate(load_schema(REPO / "schemas/criteo.yaml"), 1100, 1, root / "valid", seed=2)
    p = Pipeline.from_file(PIPELINE)
    p.fit(sorted((root / "train").glob("*.parquet")))
    p.save(root / "artifacts")
    return {"train": root / "train", "valid": root / "valid", "artifacts": root / "artifacts", "root": root}


def _fit(data: dict[str, Path], seen: list, **trainer: Any) -> Any:
    """Fit the example's model under the example's callback, recording (step kind, epoch, batch) in ``seen``; the
    trainer, and the data module."""
    ex = _example()

    class Recording(ex.TinyCTR):
        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            seen.append(("train", self.current_epoch, type(batch), batch["C1"].clone(), batch["label"].clone()))
            return super().training_step(batch, index)

        def validation_step(self, batch: Any, index: int) -> None:
            seen.append(("valid", self.trainer.sanity_checking, type(batch), batch["C1"].clone(), batch["label"].clone()))
            super().validation_step(batch, index)

    module = ex.LoaderDataModule(str(data["train"]), str(data["valid"]), str(PIPELINE), str(data["artifacts"]), batch_size=500, seed=0)
    module.setup("fit")
    model = Recording(module.train.layout.dense, module.train.pipeline.cardinalities())
    ckpt, extra = trainer.pop("ckpt_path", None), trainer.pop("extra", [])
    run = L.Trainer(callbacks=[ex.LoaderEpochs(), *extra], default_root_dir=data["root"], logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=bool(extra), **trainer)  # fmt: skip
    run.fit(model, datamodule=module, ckpt_path=ckpt)
    return run, module


def _loader_epoch(data: dict[str, Path], source: str, epoch: int, shuffle: bool) -> list[torch.Tensor]:
    loader = Loader(data[source], PIPELINE, data["artifacts"], batch_size=500, seed=0, shuffle=shuffle)
    loader.set_epoch(epoch)
    return [b["C1"].clone() for b in loader]


def test_the_loaders_go_in_as_they_are_epoch_by_epoch(data: dict[str, Path]) -> None:
    seen: list = []
    run, module = _fit(data, seen, max_epochs=2)
    assert {kind for kind, *_ in seen} == {"train", "valid"} and all(t is LoaderBatch for *_, t, _, _ in seen)
    for epoch in (0, 1):  # each training epoch is the loader's epoch of that number: its own shuffle
        got = [c for kind, e, _, c, _ in seen if kind == "train" and e == epoch]
        want = _loader_epoch(data, "train", epoch, shuffle=True)
        assert len(got) == len(want) == 6 and all(torch.equal(a, b) for a, b in zip(got, want))
    valid = _loader_epoch(data, "valid", 0, shuffle=False)
    sanity = [c for kind, s, _, c, _ in seen if kind == "valid" and s]
    runs = [c for kind, s, _, c, _ in seen if kind == "valid" and not s]
    assert len(valid) == 3 and len(sanity) == 2  # the sanity check stops after two batches...
    assert len(runs) == 2 * 3 and all(torch.equal(a, b) for a, b in zip(runs, valid + valid))  # ...each run reads them all
    assert {"train_loss", "valid_loss"} <= set(run.callback_metrics)


def test_a_run_resumed_from_a_checkpoint_trains_on_the_batches_of_an_uninterrupted_one(data: dict[str, Path]) -> None:
    whole: list = []
    every = L.pytorch.callbacks.ModelCheckpoint(dirpath=data["root"] / "ckpt", every_n_train_steps=8, save_top_k=-1)
    _fit(data, whole, max_epochs=2, num_sanity_val_steps=0, extra=[every])  # a checkpoint at step 8: in epoch 1
    path = data["root"] / "ckpt" / "epoch=1-step=8.ckpt"
    state = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["position"]) for s in state] == [(1, 2)]  # the training loader's exact position
    rest: list = []
    _fit(data, rest, max_epochs=2, num_sanity_val_steps=0, ckpt_path=path)
    train = [(e, c, y) for kind, e, _, c, y in whole if kind == "train"]
    resumed = [(e, c, y) for kind, e, _, c, y in rest if kind == "train"]
    assert len(train) == 12 and len(resumed) == 4
    assert all(a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]) for a, b in zip(resumed, train[8:]))
