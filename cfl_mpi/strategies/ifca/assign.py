"""IFCA cluster identity estimation (Ghosh et al., NeurIPS 2020, Algorithm 1 step 'estimate').

Each silo evaluates every cluster model on its own data and joins the one with the
lowest loss. Kept apart from the CFL maths: it shares nothing with the bipartition.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ifca_assign"]


def ifca_assign(losses: np.ndarray) -> np.ndarray:
    """argmin_k loss[i, k] per silo for an (n_silos, K) table; ties go to the lowest k.

    A NaN loss (a diverged model) counts as +inf, so it never attracts a silo that has a
    finite alternative. Returns int64 cluster indices.
    """
    table = np.asarray(losses, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] == 0:
        raise ValueError(f"losses must be an (n_silos, K) table with K >= 1, got shape {table.shape}")
    return np.argmin(np.where(np.isnan(table), np.inf, table), axis=1).astype(np.int64)
