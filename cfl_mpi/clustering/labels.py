"""Cluster labels in canonical form, so equal partitions compare equal."""

from __future__ import annotations

import numpy as np


def relabel_by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """Renumber clusters 0, 1, 2, ... in order of their first member (silo 0 is in cluster 0)."""
    _, first, inverse = np.unique(np.asarray(labels), return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.ravel()]


def adjusted_rand_index(truth: np.ndarray, labels: np.ndarray) -> float:
    """Hubert and Arabie's adjusted Rand index (J. Classification 1985), as scikit-learn's
    `adjusted_rand_score` computes it: from the pair confusion counts (tp, fp, fn, tn),
    ARI = 2 (tp·tn − fn·fp) / ((tp + fn)(fn + tn) + (tp + fp)(fp + tn)), 1.0 where the two
    partitions agree on every pair. Written here because importing scikit-learn costs the
    server rank more start-up than the rest of what it loads besides torch."""
    truth, labels = np.asarray(truth).ravel(), np.asarray(labels).ravel()
    n = truth.size
    _, t = np.unique(truth, return_inverse=True)
    _, p = np.unique(labels, return_inverse=True)
    t, p = t.ravel(), p.ravel()
    joint = np.bincount(t * (p.max(initial=0) + 1) + p)
    same_both = int((joint * joint).sum()) - n  # ordered pairs together in both
    same_truth = int((np.bincount(t) ** 2).sum()) - n
    same_labels = int((np.bincount(p) ** 2).sum()) - n
    tp, fp, fn = same_both, same_labels - same_both, same_truth - same_both
    tn = n * n - n - tp - fp - fn
    if fp == 0 and fn == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))
