"""Earth Mover's distance W1 between uniform empirical measures (EMD-CFL Alg. 1, line 16).

With n = m points of uniform weight, exact W1 is a linear assignment problem (Birkhoff:
an optimal plan is a permutation matrix), which scipy's `linear_sum_assignment` solves
faster than a network simplex on the full plan. With m = k·n (k a small integer) it is one
too: each of the n points, repeated k times with weight 1/(kn), is the same measure, so W1
is the assignment cost of the k-fold repeated cost matrix; its many ties suit LAPJV (`lap`,
from lapx). `benchmarks/w1.py` measures all three. POT's `emd2` covers any other n ≠ m;
`assignment_sizes` says how far two clouds are cut for W1 to be an assignment problem.
Sinkhorn (entropic, Cuturi 2013) is the approximate variant of Appendix E.2.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

# The solvers (solvers.py: scipy.optimize, lapx, POT) are imported where they are used: every
# rank imports this module (through the strategy registry), but only the parties that measure
# distances call into them, and those load them when they start (their halves' `modules()`).

GroundCost = Literal["cosine", "chordal", "euclidean", "sqeuclidean"]
Solver = Literal["exact", "sinkhorn"]

__all__ = [
    "assignment_sizes",
    "cosine_cost",
    "ground_cost",
    "ground_costs",
    "squared_euclidean_cost",
    "transport_cost",
    "unit_rows",
    "w1",
    "w1_assignment",
    "w1_emd",
    "w1_repeated",
]

MAX_REPEAT = 4  # repeat a side at most 4-fold: a (4n)² assignment is still faster than the simplex


def ground_cost(x: np.ndarray, y: np.ndarray, metric: GroundCost = "cosine") -> np.ndarray:
    """Pairwise cost matrix C[i, j] = d(x_i, y_j) in float64: the one ground cost of the package.

    "chordal" is the Euclidean distance between the L2-normalised rows, sqrt(2 * cosine
    distance): a monotone function of the cosine cost that is a Euclidean cost, as FedWaD
    (and any geodesic argument) needs. The Euclidean costs are computed after shifting both
    clouds by a common centre: they are translation invariant, and the |x|² + |y|² − 2 x·y
    expansion loses precision far from the origin; round-off negatives are clipped to 0.
    The arithmetic is POT's `ot.dist` (numpy backend) operation for operation, so the values
    are its bits (tests/ot/test_wasserstein.py), without importing POT where no plan is solved.
    """
    return ground_costs(np.asarray(x)[None], np.asarray(y)[None], metric)[0]


def ground_costs(xs: np.ndarray, ys: np.ndarray, metric: GroundCost = "cosine") -> np.ndarray:
    """`ground_cost` of each pair of clouds (xs[k], ys[k]) of two stacks (k, n, d) and (k, m, d),
    (k, n, m), in one call for a batch of pairs: each matrix the bits of the pair's on its own
    (tests/ot/test_wasserstein.py)."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    if not (np.isfinite(xs).all() and np.isfinite(ys).all()):
        raise ValueError("ground_cost: non-finite coordinates")
    if metric == "cosine":
        return cosine_cost(xs, ys)
    if metric == "chordal":
        xs, ys = unit_rows(xs), unit_rows(ys)
    centre = 0.5 * (xs.mean(axis=-2, keepdims=True) + ys.mean(axis=-2, keepdims=True))
    sq = squared_euclidean_cost(xs - centre, ys - centre)
    return sq if metric == "sqeuclidean" else np.sqrt(sq, out=sq)


def cosine_cost(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """1 − x_i·y_j / (|x_i| |y_j|), as `ot.dist(x, y, "cosine")` computes it; x and y (n, d) and
    (m, d), or stacks of them."""
    norm_x = np.sqrt(np.einsum("...ij,...ij->...i", x, x))
    norm_y = np.sqrt(np.einsum("...ij,...ij->...i", y, y))
    return 1.0 - (np.matmul(x, np.swapaxes(y, -1, -2)) / norm_x[..., :, None] / norm_y[..., None, :])


def squared_euclidean_cost(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x_i − y_j|² as |x_i|² + |y_j|² − 2 x_i·y_j, negatives clipped to 0, as
    `ot.dist(x, y, "sqeuclidean")` computes it; x and y (n, d) and (m, d), or stacks of them."""
    cost = -2 * np.matmul(x, np.swapaxes(y, -1, -2))
    cost += np.einsum("...ij,...ij->...i", x, x)[..., :, None]
    cost += np.einsum("...ij,...ij->...i", y, y)[..., None, :]
    return np.maximum(cost, 0)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """The rows (along the last axis) scaled to unit length, zero rows left at 0: scikit-learn's
    `normalize` (the same row norms, sqrt of an einsum), without its input checks, which cost
    more than the arithmetic on the ~100-point clouds W is measured on."""
    norms = np.sqrt(np.einsum("...j,...j->...", x, x))
    norms[norms == 0.0] = 1.0
    return x / norms[..., None]


def w1_assignment(cost: np.ndarray) -> float:
    """Exact W1 for n = m uniform points: the mean cost of an optimal assignment."""
    if cost.shape[0] != cost.shape[1]:
        raise ValueError(f"w1_assignment needs a square cost matrix, got {cost.shape}")
    from .solvers import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def assignment_sizes(n: int, m: int) -> tuple[int, int]:
    """The sizes (n', m') ≤ (n, m) whose uniform W1 is an assignment problem (`w1_repeated`):
    the smaller kept, the larger cut to the largest multiple of it, at most MAX_REPEAT-fold."""
    small = min(n, m)
    large = small * min(MAX_REPEAT, max(n, m) // small)
    return (small, large) if n <= m else (large, small)


def w1_repeated(cost: np.ndarray) -> float:
    """Exact W1 for n and m = k·n uniform points (or n = k·m): the assignment cost of the
    cost matrix with each point of the smaller side repeated k times, by LAPJV."""
    n, m = cost.shape
    small, large = min(n, m), max(n, m)
    if large % small:
        raise ValueError(f"w1_repeated needs one size a multiple of the other, got {cost.shape}")
    square = np.repeat(cost, large // small, axis=0 if n < m else 1)
    from lap import lapjv  # lapx alone: the silos' τ and noise need no other solver

    _, cols, _ = lapjv(square)
    return float(square[np.arange(large), cols].mean())


def w1_emd(cost: np.ndarray) -> float:
    """Exact W1 for uniform weights of any sizes, by POT's network simplex."""
    from .solvers import ot

    n, m = cost.shape
    return float(ot.emd2(np.full(n, 1.0 / n), np.full(m, 1.0 / m), cost, numItermax=10_000_000))


def w1(
    x: np.ndarray, y: np.ndarray, metric: GroundCost = "cosine", solver: Solver = "exact", reg: float = 0.1
) -> float:
    """W1 between the uniform empirical measures on the rows of x and of y."""
    return transport_cost(ground_cost(x, y, metric), solver, reg)


def transport_cost(cost: np.ndarray, solver: Solver = "exact", reg: float = 0.1) -> float:
    """W1 between uniform weights on the rows and the columns of a ground-cost matrix."""
    if solver == "sinkhorn":
        from .pot import ot

        n, m = cost.shape
        return float(ot.sinkhorn2(np.full(n, 1.0 / n), np.full(m, 1.0 / m), cost, reg))
    n, m = cost.shape
    if n == m:
        return w1_assignment(cost)
    if max(n, m) % min(n, m) == 0 and max(n, m) <= MAX_REPEAT * min(n, m):
        return w1_repeated(cost)
    return w1_emd(cost)
