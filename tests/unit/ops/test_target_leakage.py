"""Why out-of-fold: on generated data whose categories carry no signal (the label depends on a dense feature only),
a logistic regression on [x, target encoding] trained with the encoding fitted naively (in fold: each training row's
own label inside its value) scores a markedly better train AUC and a markedly worse validation AUC than one trained
with the out-of-fold encoding, which sees through the category as the noise it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.bench.metrics import auc
from etl.io.parquet import open_shard
from etl.pipeline import Pipeline
from etl.schema import parse_schema

SCHEMA = parse_schema({"name": "noise", "columns": [{"name": "label", "role": "label", "dtype": "int64"},
                                                     {"name": "c", "role": "categorical", "dtype": "int64", "encoding": "int"},
                                                     {"name": "x", "role": "dense", "dtype": "float64"}]})  # fmt: skip


def logistic_regression(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The weights of a logistic regression (Newton's method)."""
    w = np.zeros(x.shape[1])
    for _ in range(30):
        p = 1 / (1 + np.exp(-x @ w))
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + 1e-9 * np.eye(x.shape[1])
        w += np.linalg.solve(hessian, x.T @ (y - p))
    return w


def events(path: Path, seed: int, n: int = 20_000, categories: int = 5_000) -> Path:
    """About four rows per category, the label drawn from the dense feature alone."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    label = (rng.random(n) < 1 / (1 + np.exp(-(x - 0.5)))).astype(np.int64)
    pq.write_table(pa.table({"label": label, "c": rng.integers(0, categories, n), "x": x}), path)
    return path


def test_in_fold_encoding_leaks_and_out_of_fold_does_not(tmp_path: Path) -> None:
    train, valid = events(tmp_path / "train.parquet", 1), events(tmp_path / "valid.parquet", 2)
    p = Pipeline({"ops": [{"op": "Decode", "columns": ["c"]}, {"op": "Categorify", "columns": ["c"]},
                          {"op": "TargetEncode", "columns": ["c"], "target": "label", "kfold": 5, "smoothing": 1}]}, SCHEMA)  # fmt: skip
    p.fit([train])

    def features(path: Path, training: bool) -> tuple[np.ndarray, np.ndarray]:
        t = p.to_arrow(p.transform(open_shard(path, SCHEMA).read(0), training=training).batch)
        return np.c_[np.ones(t.num_rows), t["x"].to_numpy(), t["te_c"].to_numpy()], t["label"].to_numpy()

    x_valid, y_valid = features(valid, training=False)  # validation rows: the full statistics either way
    scores = {}
    for name, training in (("in fold", False), ("out of fold", True)):
        x, y = features(train, training)
        w = logistic_regression(x, y)
        scores[name] = (auc(y, x @ w), auc(y_valid, x_valid @ w), auc(y, x[:, 2]))
    (naive_train, naive_valid, naive_alone), (oof_train, oof_valid, oof_alone) = scores["in fold"], scores["out of fold"]
    assert naive_train > oof_train + 0.05, scores  # the leak looks like signal on the training rows...
    assert naive_valid < oof_valid - 0.05, scores  # ...and costs on new rows
    assert naive_alone > 0.7 and abs(oof_alone - 0.5) < 0.03, scores  # the encoding alone: pure leak, or nothing
