"""CFL maths (bipartition, split criterion, orthonormal transform, parameter tree)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cfl_mpi.clustering.bipartition import (
    ClusterTree,
    max_cross_similarity,
    optimal_bipartition,
    orthonormal_transform,
    pairwise_cosine,
    should_split,
    update_norms,
)


def _brute_force_min_max_cross(S: np.ndarray) -> float:
    """min over all bipartitions of the largest cross similarity (Eq. 33), by enumeration."""
    m, best = S.shape[0], np.inf
    for mask in range(1, 2 ** (m - 1)):  # index m-1 always on the "off" side: each split once
        on = np.array([(mask >> i) & 1 for i in range(m)], dtype=bool)
        best = min(best, S[np.ix_(on, ~on)].max())
    return best


def _is_bipartition(c1: np.ndarray, c2: np.ndarray, m: int) -> bool:
    return len(c1) > 0 and len(c2) > 0 and sorted(np.concatenate([c1, c2]).tolist()) == list(range(m))


@pytest.mark.parametrize("m", range(2, 10))
def test_optimal_bipartition_matches_brute_force(m: int) -> None:
    rng = np.random.default_rng(m)
    for trial in range(6):
        if trial % 2:  # coarse values: many ties
            S = np.round(rng.uniform(-1, 1, (m, m)), 1)
            S = np.triu(S, 1) + np.triu(S, 1).T + np.eye(m)
        else:
            S = pairwise_cosine(rng.standard_normal((m, 6)))
        c1, c2 = optimal_bipartition(S)
        assert _is_bipartition(c1, c2, m) and 0 in c1
        assert max_cross_similarity(S, c1, c2) == pytest.approx(_brute_force_min_max_cross(S))


def test_optimal_bipartition_separates_two_directions() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2, 50))
    truth = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    updates = base[truth] + 0.3 * rng.standard_normal((8, 50))
    c1, c2 = optimal_bipartition(pairwise_cosine(updates))
    np.testing.assert_array_equal(c1, np.flatnonzero(truth == 0))
    np.testing.assert_array_equal(c2, np.flatnonzero(truth == 1))


def test_pairwise_cosine_and_norms() -> None:
    x = np.array([[3.0, 4.0], [4.0, -3.0], [-6.0, -8.0], [0.0, 0.0]])
    S = pairwise_cosine(x)
    np.testing.assert_allclose(S[:3, :3], [[1, 0, -1], [0, 1, 0], [-1, 0, 1]], atol=1e-12)
    np.testing.assert_array_equal(S[3], 0.0)  # a zero update is similar to nothing
    mean_norm, max_norm = update_norms(x[:2])
    assert mean_norm == pytest.approx(np.linalg.norm([3.5, 0.5])) and max_norm == pytest.approx(5.0)
    assert update_norms(x[:2], weights=np.array([1.0, 0.0]))[0] == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("mean", "peak", "n", "expected"),
    [(0.1, 2.0, 3, True), (0.5, 2.0, 3, False), (0.1, 1.0, 3, False), (0.1, 2.0, 2, False), (0.4, 1.6, 5, False)],
)
def test_should_split(mean: float, peak: float, n: int, expected: bool) -> None:
    assert should_split(mean, peak, n, eps1=0.4, eps2=1.6) is expected


def test_orthonormal_transform_is_orthogonal() -> None:
    T = orthonormal_transform(70, seed=3, block=16)  # 4 full blocks and a tail of 6
    P = T.forward(np.eye(70)).T  # column i is P e_i
    np.testing.assert_allclose(P.T @ P, np.eye(70), atol=1e-12)
    assert np.count_nonzero(np.abs(P) > 1e-12) > 70 * 10, "mixes coordinates, not only a permutation"


def test_orthonormal_transform_keeps_cosines_norms_and_bipartition() -> None:
    rng = np.random.default_rng(1)
    updates = rng.standard_normal((7, 1000)) + np.repeat(rng.standard_normal((2, 1000)), [4, 3], axis=0)
    T = orthonormal_transform(1000, seed=2**100 + 5, block=64)
    hidden = T.forward(updates)
    np.testing.assert_allclose(np.linalg.norm(hidden, axis=1), np.linalg.norm(updates, axis=1), rtol=1e-12)
    np.testing.assert_allclose(pairwise_cosine(hidden), pairwise_cosine(updates), atol=1e-12)
    for a, b in zip(optimal_bipartition(pairwise_cosine(hidden)), optimal_bipartition(pairwise_cosine(updates))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(T.inverse(hidden), updates, atol=1e-12)
    np.testing.assert_allclose(T.inverse(hidden.mean(axis=0)), updates.mean(axis=0), atol=1e-12)  # Eq. 42


def test_orthonormal_transform_seeding_dtype_and_size() -> None:
    x = np.random.default_rng(0).standard_normal(300_001).astype(np.float32)
    a, b = orthonormal_transform(x.size, seed=11), orthonormal_transform(x.size, seed=11)
    y = a.forward(x)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, b.forward(x))
    assert not np.allclose(y, orthonormal_transform(x.size, seed=12).forward(x))
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-5)
    np.testing.assert_allclose(a.inverse(y), x, atol=1e-5)
    with pytest.raises(ValueError):
        a.forward(x[:-1])


def _tree_with_two_splits() -> ClusterTree:
    """Root {0..5}: {0,1,2} lean to e0, {3,4,5} to e1; then {3,4,5}: {3,4} to e2, {5} to e3."""
    e = np.eye(6)
    tree = ClusterTree(list(range(6)))
    left, right = tree.split(
        0, [2, 0, 1], [3, 4, 5], round=21, left_updates=e[[0, 0, 0]] + 0.1, right_updates=3 * e[[1, 1, 1]] + 0.1
    )
    assert (left, right) == (1, 2)
    assert tree.split(2, [3, 4], [5], round=40, left_updates=e[[2, 2]], right_updates=e[[3]]) == (3, 4)
    return tree


def test_cluster_tree_split_leaves_members() -> None:
    tree = _tree_with_two_splits()
    assert tree.leaves() == [1, 3, 4]
    assert [tree.members(n) for n in tree.leaves()] == [[0, 1, 2], [3, 4], [5]]
    assert tree.children(0) == [1, 2] and tree.children(1) == []
    with pytest.raises(ValueError):
        tree.split(0, [0], [1, 2, 3, 4, 5], round=50, left_updates=np.ones((1, 6)), right_updates=np.ones((5, 6)))
    with pytest.raises(ValueError):
        tree.split(1, [0], [1], round=50, left_updates=np.ones((1, 6)), right_updates=np.ones((1, 6)))  # 2 missing


def test_cluster_tree_route_and_add_silo() -> None:
    tree = _tree_with_two_splits()
    e = np.eye(6)
    assert tree.route(e[0]) == 1
    assert tree.route(e[1] + 0.2 * e[2]) == 3
    per_level = {0: e[1], 2: e[3]}  # Algorithm 4: a fresh update from each node's model
    assert tree.route(lambda node: per_level[node]) == 4
    tree.add_silo(6, 4)
    assert tree.members(4) == [5, 6] and tree.members(2) == [3, 4, 5, 6] and 6 in tree.members(0)
    with pytest.raises(ValueError):
        tree.add_silo(6, 1)


def test_cluster_tree_to_dict_is_json() -> None:
    d = json.loads(json.dumps(_tree_with_two_splits().to_dict()))
    nodes = {n["id"]: n for n in d["nodes"]}
    assert nodes[0] == {
        "id": 0,
        "parent": None,
        "children": [1, 2],
        "members": [0, 1, 2, 3, 4, 5],
        "split_round": 21,
        "n_references": 0,
    }
    assert nodes[2]["split_round"] == 40 and nodes[2]["n_references"] == 3
    assert nodes[4] == {"id": 4, "parent": 2, "children": [], "members": [5], "split_round": None, "n_references": 1}
