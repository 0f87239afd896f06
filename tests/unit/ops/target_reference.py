"""An independent reference of TargetEncode, in plain pandas and Python ints: the documented folds (from the hash
formulas of ``etl.backends.hashing``, written out row by row) and the encodings (group sums, then the documented
formulas in float64, written as float32)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from etl.backends.hashing import cross_key, hash64, reduce, string_key


def position_folds(file_name: str, rows: int, kfold: int, seed: int) -> np.ndarray:
    """The fold of rows 0 .. rows - 1 of the file named ``file_name``: reduce(cross_key([string_key(name), row], seed), kfold)."""
    name = string_key(file_name.encode())
    return np.array([reduce(cross_key([name, r], seed), kfold) for r in range(rows)], np.int64)


def value_folds(ids: np.ndarray, kfold: int, seed: int) -> np.ndarray:
    """The fold of rows whose fold_by id is ``ids``: reduce(hash64(id, seed), kfold)."""
    return np.array([reduce(hash64(int(v), seed), kfold) for v in ids], np.int64)


def encode(rows: pd.DataFrame, fit: pd.DataFrame, group: list[str], target: str, smoothing: float, training: bool) -> np.ndarray:
    """The float32 encodings of ``rows`` for the category ``group`` (columns of category values; a cross: several),
    from the statistics of the fit rows ``fit`` (their ``target``, missing ones left out, and their ``fold``);
    ``training``: ``rows`` are the fit rows, each given its out-of-fold value by its ``fold``."""
    fit = fit[fit[target].notna()]
    m = float(smoothing)
    n_all, s_all = len(fit), float(fit[target].sum())
    per_cat = fit.groupby(group)[target].agg(["count", "sum"])
    if not training:
        prior = s_all / n_all if n_all else 0.0
        joined = rows[group].merge(per_cat, left_on=group, right_index=True, how="left")
        seen = joined["count"].notna().to_numpy()
        count, total = joined["count"].fillna(0).to_numpy(), joined["sum"].fillna(0).to_numpy()
        out = np.where(seen, (total + m * prior) / (count + m), prior)
        return out.astype(np.float32)
    per_fold = fit.groupby("fold")[target].agg(["count", "sum"]).rename(columns={"count": "n_f", "sum": "s_f"})
    per_cat_fold = fit.groupby([*group, "fold"])[target].agg(["count", "sum"]).rename(columns={"count": "n_cf", "sum": "s_cf"})
    joined = (rows[[*group, "fold"]].merge(per_cat, left_on=group, right_index=True, how="left")
              .merge(per_cat_fold, left_on=[*group, "fold"], right_index=True, how="left")
              .merge(per_fold, left_on="fold", right_index=True, how="left").fillna(0))  # fmt: skip
    n_f, s_f = joined["n_f"].to_numpy(np.int64), joined["s_f"].to_numpy(np.float64)
    prior_f = np.where(n_all - n_f > 0, (s_all - s_f) / np.maximum(n_all - n_f, 1), 0.0)
    n = joined["count"].to_numpy(np.int64) - joined["n_cf"].to_numpy(np.int64)
    s = joined["sum"].to_numpy(np.float64) - joined["s_cf"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(n + m > 0, (s + m * prior_f) / (n + m), prior_f)
    return out.astype(np.float32)
