"""PACFL maths: data-subspace signatures, principal angles, proximity matrix, clustering.

Vahidian et al., "Efficient Distribution Similarity Identification in Clustered FL via
Principal Angles Between Client Data Subspaces" (PACFL, AAAI 2023):

- a silo summarises its data by the top-p left singular vectors of its data matrix
  (features x samples), per class and stacked, as the authors' code does;
- the server compares two silos by the principal angles between the spans of their
  signatures: Eq. 2 (smallest angle) or Eq. 3 (sum of the angles), in degrees;
- agglomerative clustering (average linkage) with distance threshold beta gives the
  clusters (Algorithm 1); newcomers are placed with the proximity matrix extended by
  their rows (Algorithm 2, PME) without moving anyone already placed (Algorithm 3).

Everything here is plain numpy/scipy on small matrices; no communication happens here.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .labels import relabel_by_first_appearance


def orth(a: np.ndarray) -> np.ndarray:
    """scipy.linalg.orth, imported on first use (the server's; the silos' import stays light)."""
    from scipy.linalg import orth as scipy_orth

    return scipy_orth(a)


__all__ = [
    "class_subspace_basis",
    "principal_angles",
    "proximity_matrix",
    "extend_proximity_matrix",
    "hierarchical_clusters",
    "place_new_silos",
]

Measure = Literal["sum", "smallest"]


def _top_left_singular_vectors(data_matrix: np.ndarray, p: int) -> np.ndarray:
    """The p most significant left singular vectors of a (features x samples) matrix.

    A class with fewer than p samples (or rank) yields only as many vectors as it has
    columns: the extra vectors would span directions the data never visited.
    """
    u, _, _ = np.linalg.svd(data_matrix, full_matrices=False)
    return u[:, :p]


def class_subspace_basis(features: np.ndarray, labels: np.ndarray | None, p: int) -> np.ndarray:
    """A silo's PACFL signature U_p (the vectors it sends to the server, Algorithm 1 line 8).

    `features` is (n samples, d features); the data matrix of the paper is its transpose.
    With labels, each class present (in ascending label order) contributes its own top-p
    left singular vectors and the blocks are stacked column-wise, as in the authors' code;
    with `labels=None`, the top-p vectors of the whole data matrix (the paper's text).
    The data are not centred: the paper takes the SVD of the raw data matrix.
    Returns a (d, k) matrix whose column blocks are orthonormal; k <= p * n_classes.
    """
    if p < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (n, d) array, got shape {x.shape}")
    if labels is None:
        return _top_left_singular_vectors(x.T, p)
    y = np.asarray(labels)
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},), got {y.shape}")
    blocks = [_top_left_singular_vectors(x[y == c].T, p) for c in np.unique(y)]
    return np.hstack(blocks)


def _angles_orthonormal(qa: np.ndarray, qb: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between spans of two orthonormal bases."""
    cosines = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return np.arccos(np.clip(cosines, -1.0, 1.0))


def principal_angles(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Principal angles between span(U) and span(V), in radians, ascending (paper Eq. 1).

    The inputs need not be orthonormal (a stacked per-class signature is not), so both are
    orthonormalised first; the cosines of the angles are then the singular values of
    Q_Uᵀ Q_V. There are min(rank U, rank V) angles. arccos loses precision below about
    1e-8 rad, which is far below anything the clustering threshold can resolve.
    """
    return _angles_orthonormal(orth(np.asarray(U, dtype=np.float64)), orth(np.asarray(V, dtype=np.float64)))


def _reduce(angles: np.ndarray, measure: Measure) -> float:
    """One proximity entry in degrees: Eq. 3 (sum) or Eq. 2 (smallest angle)."""
    if measure == "sum":
        return float(np.degrees(angles.sum()))
    if measure == "smallest":
        return float(np.degrees(angles[0])) if angles.size else 0.0
    raise ValueError(f"measure must be 'sum' or 'smallest', got {measure!r}")


def proximity_matrix(bases: list[np.ndarray], measure: Measure = "sum") -> np.ndarray:
    """The server's proximity matrix A (Eq. 3 for "sum", Eq. 2 for "smallest"), in degrees.

    Each signature is orthonormalised once; A is symmetric with an exact zero diagonal.
    Smaller entries mean more similar data distributions.
    """
    qs = [orth(np.asarray(b, dtype=np.float64)) for b in bases]
    m = len(qs)
    A = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            A[i, j] = A[j, i] = _reduce(_angles_orthonormal(qs[i], qs[j]), measure)
    return A


def extend_proximity_matrix(
    A_old: np.ndarray,
    bases_old: list[np.ndarray],
    bases_new: list[np.ndarray],
    measure: Measure = "sum",
) -> np.ndarray:
    """Algorithm 2 (PME): the (M+B)x(M+B) matrix, keeping A_old and adding the new rows.

    Only the pairs involving a newcomer are computed: new-vs-old and new-vs-new.
    """
    M, B = len(bases_old), len(bases_new)
    if A_old.shape != (M, M):
        raise ValueError(f"A_old has shape {A_old.shape}, expected ({M}, {M})")
    q_old = [orth(np.asarray(b, dtype=np.float64)) for b in bases_old]
    q_new = [orth(np.asarray(b, dtype=np.float64)) for b in bases_new]
    A = np.zeros((M + B, M + B))
    A[:M, :M] = A_old
    for b, qb in enumerate(q_new):
        row = M + b
        for j, qj in enumerate(q_old + q_new[:b]):
            A[row, j] = A[j, row] = _reduce(_angles_orthonormal(qb, qj), measure)
    return A


def hierarchical_clusters(A: np.ndarray, beta: float) -> np.ndarray:
    """HC(A, beta) of Algorithm 1: average-linkage agglomeration stopped at distance beta.

    Two groups merge while their average pairwise proximity is <= beta (scipy's UPGMA on
    the condensed matrix). A is symmetrised and its diagonal ignored. Returns int64 labels
    numbered 0, 1, ... in order of first appearance.
    """
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be square, got shape {A.shape}")
    m = A.shape[0]
    if m == 1:
        return np.zeros(1, dtype=np.int64)
    D = (A + A.T) / 2.0
    np.fill_diagonal(D, 0.0)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(D, checks=False), method="average")
    return relabel_by_first_appearance(fcluster(tree, t=beta, criterion="distance"))


def place_new_silos(A_full: np.ndarray, labels_existing: np.ndarray, beta: float) -> np.ndarray:
    """Algorithms 2-3: cluster ids for newcomers, leaving every existing silo's id unchanged.

    A_full is the extended proximity matrix (existing silos first, as PME builds it). As in
    Algorithm 3, HC(A_full, beta) is rerun with the same beta; a newcomer then joins an
    existing cluster sharing its new HC group (the one of smallest average proximity to the
    newcomer if the group spans several), or, if its group holds no existing silo, a fresh
    cluster shared with the other newcomers of that group, numbered after the existing ids.
    """
    old = np.asarray(labels_existing, dtype=np.int64)
    M, n = old.size, A_full.shape[0]
    if A_full.shape != (n, n) or n < M:
        raise ValueError(f"A_full has shape {A_full.shape}, expected square with side >= {M}")
    groups = hierarchical_clusters(A_full, beta)
    labels = np.empty(n, dtype=np.int64)
    labels[:M] = old
    next_id = int(old.max()) + 1 if M else 0
    fresh: dict[int, int] = {}
    for k in range(M, n):
        candidates = np.unique(old[groups[:M] == groups[k]])
        if candidates.size:
            mean_dist = [A_full[k, :M][old == c].mean() for c in candidates]
            labels[k] = candidates[int(np.argmin(mean_dist))]
        else:
            if groups[k] not in fresh:
                fresh[groups[k]] = next_id
                next_id += 1
            labels[k] = fresh[groups[k]]
    return labels
