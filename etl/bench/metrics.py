"""Metrics of a binary classifier on an evaluation set: ``auc`` (the area under the ROC curve) and ``log_loss``."""

from __future__ import annotations

import numpy as np


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """The ROC AUC of ``score`` for the 0/1 labels ``y``: the Mann-Whitney U of the positives over positives times
    negatives, tied scores at their average rank (a tie between a positive and a negative counts one half).
    ``ValueError`` when ``y`` holds a single class (the AUC is undefined)."""
    y = np.asarray(y)
    _, inverse, counts = np.unique(np.asarray(score), return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        raise ValueError(f"AUC needs both classes: {n_pos} positives, {n_neg} negatives")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def log_loss(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> float:
    """The mean binary cross-entropy of the probabilities ``p`` (clipped to ``[eps, 1 - eps]``) for the 0/1 labels
    ``y``, in nats."""
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    y = np.asarray(y, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
