"""PACFL maths: signatures, principal angles, proximity matrix, HC and newcomer placement."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import subspace_angles
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.principal_angles import (
    class_subspace_basis,
    extend_proximity_matrix,
    hierarchical_clusters,
    place_new_silos,
    principal_angles,
    proximity_matrix,
)

D, P, N_CLASSES, N_PER_CLASS = 40, 2, 2, 30


def _random_subspace(rng: np.random.Generator, d: int, r: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((d, r)))[0]


def _group(rng: np.random.Generator) -> list[np.ndarray]:
    """One distribution family: each class lives near its own random P-dim subspace."""
    return [_random_subspace(rng, D, P) for _ in range(N_CLASSES)]


def _silo(rng: np.random.Generator, group: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Samples (n, D) and labels of one silo drawn from a family, with a little noise."""
    scales = np.array([3.0, 1.0])  # distinct variances, so the top-P vectors are well defined
    x = [rng.standard_normal((N_PER_CLASS, P)) * scales @ g.T for g in group]
    features = np.vstack(x) + 0.02 * rng.standard_normal((N_CLASSES * N_PER_CLASS, D))
    labels = np.repeat(np.arange(N_CLASSES), N_PER_CLASS)
    return features, labels


def _signatures(rng: np.random.Generator, groups: list[list[np.ndarray]], truth: list[int]) -> list[np.ndarray]:
    return [class_subspace_basis(*_silo(rng, groups[g]), p=P) for g in truth]


@pytest.fixture(scope="module")
def federation() -> dict:
    rng = np.random.default_rng(7)
    groups = [_group(rng) for _ in range(4)]  # group 3 is kept for newcomers only
    truth = [0, 1, 2, 0, 1, 2, 2, 0, 1, 0, 1, 2]
    return {"rng": rng, "groups": groups, "truth": np.array(truth), "bases": _signatures(rng, groups, truth)}


def test_principal_angles_match_scipy() -> None:
    rng = np.random.default_rng(0)
    shared = rng.standard_normal((30, 1))
    cases = [
        (rng.standard_normal((30, 3)), rng.standard_normal((30, 5))),  # not orthonormal, p != q
        (np.hstack([shared, rng.standard_normal((30, 2))]), np.hstack([rng.standard_normal((30, 3)), 2 * shared])),
        (np.hstack([shared, shared, rng.standard_normal((30, 1))]), rng.standard_normal((30, 4))),  # rank deficient
    ]
    for U, V in cases:
        ours = principal_angles(U, V)
        assert np.all(np.diff(ours) >= 0), "angles come ascending"
        np.testing.assert_allclose(ours, np.sort(subspace_angles(U, V)), atol=1e-6)
    assert principal_angles(cases[1][0], cases[1][1])[0] == pytest.approx(0.0, abs=1e-6)


def test_class_subspace_basis_per_class_and_plain() -> None:
    rng = np.random.default_rng(1)
    group = _group(rng)
    features, labels = _silo(rng, group)
    basis = class_subspace_basis(features, labels, p=P)
    assert basis.shape == (D, N_CLASSES * P)
    for c, g in enumerate(group):  # blocks in ascending label order, each orthonormal
        block = basis[:, c * P : (c + 1) * P]
        np.testing.assert_allclose(block.T @ block, np.eye(P), atol=1e-10)
        assert np.degrees(principal_angles(block, g)).max() < 2.0

    plain = class_subspace_basis(features, None, p=3)
    top = np.linalg.svd(features.T, full_matrices=False)[0][:, :3]
    assert plain.shape == (D, 3)
    assert principal_angles(plain, top).max() < 1e-6

    few = np.vstack([features, rng.standard_normal((1, D))])  # a class with one sample gives one vector
    assert class_subspace_basis(few, np.append(labels, 9), p=P).shape == (D, N_CLASSES * P + 1)


def test_proximity_matrix_symmetric_zero_diagonal(federation: dict) -> None:
    for measure in ("sum", "smallest"):
        A = proximity_matrix(federation["bases"], measure=measure)
        assert A.shape == (12, 12)
        np.testing.assert_array_equal(A, A.T)
        np.testing.assert_array_equal(np.diag(A), 0.0)
        assert A.min() >= 0.0 and A.max() <= 90.0 * (N_CLASSES * P if measure == "sum" else 1)
    A_sum, A_min = (proximity_matrix(federation["bases"], measure=m) for m in ("sum", "smallest"))
    assert np.all(A_min <= A_sum + 1e-12)
    np.testing.assert_allclose(A_min[0, 1], np.degrees(principal_angles(*federation["bases"][:2])[0]))


@pytest.mark.parametrize(("measure", "beta"), [("sum", 60.0), ("smallest", 15.0)])
def test_hc_recovers_subspace_groups(federation: dict, measure: str, beta: float) -> None:
    A = proximity_matrix(federation["bases"], measure=measure)
    same = federation["truth"][:, None] == federation["truth"][None, :]
    off = ~np.eye(12, dtype=bool)
    assert A[same & off].max() < beta < A[~same].min(), "the synthetic groups are separable at beta"
    labels = hierarchical_clusters(A, beta)
    assert labels.dtype == np.int64
    assert adjusted_rand_score(federation["truth"], labels) == 1.0


def test_hc_labels_and_threshold_edges() -> None:
    A = np.array([[0, 9, 1, 9], [9, 0, 9, 2], [1, 9, 0, 9], [9, 2, 9, 0]], dtype=float)
    np.testing.assert_array_equal(hierarchical_clusters(A, 5.0), [0, 1, 0, 1])
    np.testing.assert_array_equal(hierarchical_clusters(A, 0.5), [0, 1, 2, 3])
    np.testing.assert_array_equal(hierarchical_clusters(A, 100.0), [0, 0, 0, 0])
    np.testing.assert_array_equal(hierarchical_clusters(A, 1.0), [0, 1, 0, 2])  # merges at distance <= beta
    np.testing.assert_array_equal(hierarchical_clusters(np.zeros((1, 1)), 1.0), [0])


def test_newcomers_keep_existing_labels(federation: dict) -> None:
    bases, truth, beta = federation["bases"], federation["truth"], 60.0
    A_old = proximity_matrix(bases)
    rename = {0: 7, 1: 3, 2: 5}  # any numbering the server already uses must survive
    existing = np.array([rename[int(c)] for c in hierarchical_clusters(A_old, beta)])
    assert adjusted_rand_score(truth, existing) == 1.0

    rng, groups = federation["rng"], federation["groups"]
    new_truth = [1, 3, 3, 0]  # group 3 is unseen: far from every existing cluster
    new_bases = _signatures(rng, groups, new_truth)
    A_full = extend_proximity_matrix(A_old, bases, new_bases)
    np.testing.assert_allclose(A_full, proximity_matrix(bases + new_bases), atol=1e-9)

    labels = place_new_silos(A_full, existing, beta)
    np.testing.assert_array_equal(labels[:12], existing)
    group_label = {int(g): int(existing[truth == g][0]) for g in range(3)}
    np.testing.assert_array_equal(labels[12:], [group_label[1], 8, 8, group_label[0]])


def test_newcomer_bridging_two_clusters_goes_to_the_nearer() -> None:
    """HC may merge two existing clusters through a newcomer; neither moves, it picks one."""
    A = np.array(
        [
            [0, 1, 10, 10, 4],
            [1, 0, 10, 10, 4],
            [10, 10, 0, 1, 5],
            [10, 10, 1, 0, 5],
            [4, 4, 5, 5, 0],
        ],
        dtype=float,
    )
    assert hierarchical_clusters(A[:4, :4], 9.0).tolist() == [0, 0, 1, 1]
    assert hierarchical_clusters(A, 9.0).tolist() == [0, 0, 0, 0, 0]  # the newcomer bridges them
    np.testing.assert_array_equal(place_new_silos(A, np.array([0, 0, 1, 1]), beta=9.0), [0, 0, 1, 1, 0])
