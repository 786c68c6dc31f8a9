"""Cluster labels in canonical form, so equal partitions compare equal."""

from __future__ import annotations

import numpy as np


def relabel_by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """Renumber clusters 0, 1, 2, ... in order of their first member (silo 0 is in cluster 0)."""
    _, first, inverse = np.unique(np.asarray(labels), return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.ravel()]
