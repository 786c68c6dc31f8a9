"""Energy distance between uniform empirical measures: EMD-CFL's W with `distance: energy`.

The Sinkhorn divergence S_ε = OT_ε(α, β) − ½ OT_ε(α, α) − ½ OT_ε(β, β) runs from W (ε → 0)
to half the energy distance of the ground cost d (ε → ∞) (Feydy et al., AISTATS 2019,
Theorem 1): the energy distance is the OT family's debiased end. Its estimator converges
like n^(-1/2) whatever the dimension, where an empirical W1 in d dimensions converges like
n^(-1/d) (Genevay et al., AISTATS 2019): on silos of ~60 images it separates rotations that
W1 blurs (docs/research/SMALL_SILOS.md). For d of negative type (a Euclidean distance, so `euclidean`
or `chordal`) it is 0 only for equal measures (Székely & Rizzo 2013).
"""

from __future__ import annotations

import numpy as np

from .wasserstein import GroundCost, unit_rows

__all__ = ["energy_distance", "energy_distances"]


def energy_distance(x: np.ndarray, y: np.ndarray, metric: GroundCost = "chordal") -> float:
    """2 E d(X, Y) − E d(X, X') − E d(Y, Y') with the self terms over distinct points, the
    U-statistic (Székely & Rizzo 2013, eq. 4.1): unbiased, so its mean is 0 when x and y are
    samples of one distribution, whatever their sizes (the V-statistic's is not)."""
    return float(energy_distances(np.asarray(x)[None], np.asarray(y)[None], metric)[0])


def energy_distances(xs: np.ndarray, ys: np.ndarray, metric: GroundCost = "chordal") -> np.ndarray:
    """`energy_distance` of each pair of clouds (xs[k], ys[k]) of two stacks (k, n, d) and
    (k, m, d), in batched matrix products. Written out rather than by `ground_cost` (POT's
    `ot.dist`) per pair: a silo's noise takes dozens of them on clouds of a few dozen points,
    where the checks and dispatch of a call cost more than its arithmetic
    (docs/research/PERFORMANCE.md, "Batched energy distances")."""
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if xs.shape[1] < 2 or ys.shape[1] < 2:
        raise ValueError(f"energy_distance needs at least 2 points a side, got {xs.shape[1]} and {ys.shape[1]}")
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ValueError("energy_distance: non-finite coordinates")
    if metric == "chordal":  # the Euclidean distance between the L2-normalised rows (ground_cost)
        xs, ys = unit_rows(xs), unit_rows(ys)
    elif metric != "euclidean":
        raise ValueError(f"the energy distance needs a Euclidean distance (chordal or euclidean), not {metric}")
    return 2.0 * _distances(xs, ys).mean(axis=(1, 2)) - _mean_between_distinct(xs) - _mean_between_distinct(ys)


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of a[k] and b[k], (k, n, m): |a|² + |b|² − 2 a·b
    after shifting both by a common centre, round-off negatives clipped (as `ground_cost`)."""
    centre = 0.5 * (a.mean(axis=1, keepdims=True) + b.mean(axis=1, keepdims=True))
    a, b = a - centre, b - centre
    sq = -2.0 * (a @ b.transpose(0, 2, 1))
    sq += np.einsum("kij,kij->ki", a, a)[:, :, None]
    sq += np.einsum("kij,kij->ki", b, b)[:, None, :]
    return np.sqrt(np.maximum(sq, 0.0, out=sq), out=sq)


def _mean_between_distinct(x: np.ndarray) -> np.ndarray:
    """E d(X, X') over the n(n − 1) ordered pairs of distinct points of each cloud x[k]. The
    diagonal is set to 0: the square root of its round-off is ~1e-8, not 0."""
    n = x.shape[1]
    cost = _distances(x, x)
    cost[:, np.arange(n), np.arange(n)] = 0.0
    return cost.sum(axis=(1, 2)) / (n * (n - 1))
