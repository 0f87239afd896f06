"""Training with Lightning on ``etl.Loader``: no DataLoader, no collate.

``LoaderDataModule`` returns loaders from ``train_dataloader``/``val_dataloader``: a Loader is a torch
``IterableDataset`` with a length, whose items are whole batches, and Lightning iterates it as it is. Each batch is a
``LoaderBatch``: a mapping of tensors (``batch["label"]``, ``batch["C1"]``) that Lightning moves to the model's
device with its ``to`` method (a loader built with ``device="cuda"`` hands out batches already there). Lightning
saves the training loader's ``state_dict`` in its checkpoints (a Loader has ``state_dict``/``load_state_dict``), so
``Trainer.fit(..., ckpt_path=...)`` resumes at the exact batch.

Lightning calls ``set_epoch`` on a DataLoader's sampler only: the callback ``LoaderEpochs`` gives each training
epoch its own shuffle, and starts every validation run at the validation loader's first batch. From the repository
root (``docs/training.md`` tells the story):

    etl generate --schema criteo --rows 20000 --files 2 --out data/raw
    etl generate --schema criteo --rows 5000 --out data/valid-raw --seed 1
    etl preprocess --pipeline criteo --input data/raw --out data/train
    etl preprocess --pipeline criteo --input data/valid-raw --out data/valid --artifacts data/train/artifacts
    python examples/lightning_datamodule.py --train data/train --valid data/valid --epochs 2
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch

import etl


class LoaderDataModule(L.LightningDataModule):
    """Training and validation loaders over ``train`` and ``valid`` (raw shards with a ``pipeline``, and
    ``artifacts`` when it fits, or the output directories of ``etl preprocess``), made in ``setup``. ``loader``:
    the other ``etl.Loader`` keywords (batch_size, seed, device, num_workers...); the training loader shuffles."""

    def __init__(self, train: str, valid: str, pipeline: str | None = None, artifacts: str | None = None, **loader: Any):
        super().__init__()
        self.sources, self.pipeline, self.artifacts, self.loader = (train, valid), pipeline, artifacts, loader
        self.train: etl.Loader | None = None
        self.valid: etl.Loader | None = None

    def setup(self, stage: str) -> None:
        if self.train is None:
            self.train = etl.Loader(self.sources[0], self.pipeline, self.artifacts, shuffle=True, **self.loader)
            self.valid = etl.Loader(self.sources[1], self.pipeline, self.artifacts, shuffle=False, **self.loader)

    def train_dataloader(self) -> etl.Loader:
        assert self.train is not None
        return self.train

    def val_dataloader(self) -> etl.Loader:
        assert self.valid is not None
        return self.valid

    def teardown(self, stage: str) -> None:
        for loader in (self.train, self.valid):
            if loader is not None:
                loader.close()


class LoaderEpochs(L.Callback):
    """Epoch ``e`` of training reads the training loader's epoch ``e`` (its shuffle, drawn from seed and epoch), and
    every validation run reads the validation loader from its first batch.

    Lightning stops a loader after ``len(loader)`` batches (or fewer: the sanity check's two, ``limit_val_batches``)
    and starts the next run with ``iter(loader)``, which goes on with the rest of the loader's epoch: ``set_epoch``
    moves it to the start of another."""

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        trainer.datamodule.train.set_epoch(trainer.current_epoch)  # the same epoch after a resume: its position is kept

    def on_validation_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        valid = trainer.datamodule.valid
        valid.set_epoch(valid.epoch + 1)  # the next run starts at the first batch (without shuffle, in the same order)


class TinyCTR(L.LightningModule):
    """Logistic regression on the dense columns and one embedding per sparse column, read by name from the batch."""

    def __init__(self, dense: list[str], cardinalities: dict[str, int], dim: int = 8, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.dense = dense
        self.embeddings = torch.nn.ModuleDict({c: torch.nn.Embedding(n, dim) for c, n in cardinalities.items()})
        self.head = torch.nn.Linear(len(dense) + dim * len(cardinalities), 1)

    def forward(self, batch: Any) -> torch.Tensor:
        x = torch.cat([batch["dense"], *(e(batch[c].long()) for c, e in self.embeddings.items())], dim=1)
        return self.head(x).squeeze(1)

    def _loss(self, batch: Any) -> torch.Tensor:
        return torch.nn.functional.binary_cross_entropy_with_logits(self(batch), batch["label"])

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, batch_size=len(batch))  # len(batch): its rows
        return loss

    def validation_step(self, batch: Any, index: int) -> None:
        self.log("valid_loss", self._loss(batch), batch_size=len(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True, help="raw shards (with --pipeline) or an etl preprocess output")
    parser.add_argument("--valid", required=True)
    parser.add_argument("--pipeline", help="the pipeline of raw shards (a file or a shipped name)")
    parser.add_argument("--artifacts", help="its fitted artifacts, when it has something to fit")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--out", default="lightning", help="Lightning's directory: checkpoints/ (default: %(default)s)")
    parser.add_argument("--checkpoint", help="a checkpoint to resume from, at the exact batch")
    args = parser.parse_args()
    data = LoaderDataModule(args.train, args.valid, args.pipeline, args.artifacts, batch_size=args.batch_size, seed=0)
    data.setup("fit")
    assert data.train is not None
    model = TinyCTR(data.train.layout.dense, data.train.pipeline.cardinalities())
    trainer = L.Trainer(max_epochs=args.epochs, max_steps=args.max_steps, callbacks=[LoaderEpochs()], default_root_dir=args.out,
                        logger=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(model, datamodule=data, ckpt_path=args.checkpoint)
    print({k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}, "checkpoint:", trainer.checkpoint_callback.best_model_path)


if __name__ == "__main__":
    main()
