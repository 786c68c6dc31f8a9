"""Exact W1 (assignment) against POT's network simplex, and the Sinkhorn variant against POT."""

import numpy as np
import ot
import pytest

from cfl_mpi.ot.wasserstein import ground_cost, w1, w1_assignment, w1_emd, w1_repeated


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "sqeuclidean"])
@pytest.mark.parametrize("n,d", [(5, 2), (64, 16), (300, 115)])
def test_assignment_equals_pot_emd2(metric, n, d):
    rng = np.random.default_rng(n * d)
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n, d)) + 0.3
    cost = ot.dist(x, y, metric=metric)
    reference = ot.emd2(np.full(n, 1 / n), np.full(n, 1 / n), cost)
    assert w1(x, y, metric) == pytest.approx(reference, rel=1e-9, abs=1e-12)
    assert w1_assignment(cost) == pytest.approx(w1_emd(cost), rel=1e-9, abs=1e-12)


def test_unequal_sizes_use_emd():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 8)), rng.normal(size=(55, 8))
    cost = ot.dist(x, y, metric="cosine")
    assert w1(x, y) == pytest.approx(ot.emd2(np.full(40, 1 / 40), np.full(55, 1 / 55), cost), rel=1e-9)


@pytest.mark.parametrize("n,m", [(40, 80), (150, 50), (7, 28), (2, 6)])
def test_a_size_multiple_of_the_other_is_an_assignment_of_repeated_points(n, m):
    rng = np.random.default_rng(n + m)
    x, y = rng.normal(size=(n, 16)), rng.normal(size=(m, 16)) + 0.2
    cost = ot.dist(x, y, metric="cosine")
    reference = ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), cost, numItermax=10_000_000)
    assert w1_repeated(cost) == pytest.approx(reference, rel=1e-9, abs=1e-12)
    assert w1(x, y) == pytest.approx(reference, rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError, match="multiple"):
        w1_repeated(cost[:, : m - 1] if m > n else cost[: n - 1])


def test_same_cloud_is_zero_and_shift_is_detected():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 4))
    assert w1(x, x[::-1].copy(), "euclidean") == pytest.approx(0.0, abs=1e-7)  # ot.dist rounding
    # Translating every point by v moves the measure by exactly |v| in W1 (Euclidean cost).
    assert w1(x, x + np.array([3.0, 4.0, 0.0, 0.0]), "euclidean") == pytest.approx(5.0, rel=1e-9)


def test_sinkhorn_matches_pot():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(60, 5)), rng.normal(size=(60, 5))
    cost = ot.dist(x, y, metric="cosine")
    ref = ot.sinkhorn2(np.full(60, 1 / 60), np.full(60, 1 / 60), cost, 0.1)
    assert w1(x, y, "cosine", "sinkhorn", 0.1) == pytest.approx(float(ref), rel=1e-9)
    assert w1(x, y, "cosine", "sinkhorn", 0.1) >= w1(x, y, "cosine") - 1e-9  # entropic cost ≥ exact


def test_non_finite_rejected():
    with pytest.raises(ValueError, match="non-finite"):
        ground_cost(np.array([[np.nan, 1.0]]), np.ones((1, 2)))


def test_chordal_cost_is_the_cosine_geometry_as_a_euclidean_cost():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(6, 5)), rng.normal(size=(4, 5)) * 7.0
    chordal = ground_cost(x, y, "chordal")
    assert np.allclose(chordal, np.sqrt(2.0 * ot.dist(x, y, metric="cosine")))
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    assert np.allclose(chordal, ot.dist(unit(x), unit(y), metric="euclidean"))


def test_chordal_cost_is_the_euclidean_cost_of_scikit_learns_normalised_rows():
    from sklearn.preprocessing import normalize

    rng = np.random.default_rng(7)
    x, y = np.abs(rng.normal(size=(30, 9))) * 50, np.abs(rng.normal(size=(20, 9)))
    x[3] = 0.0  # a dead ReLU row stays at the origin, as scikit-learn leaves it
    expected = np.linalg.norm(normalize(x)[:, None, :] - normalize(y)[None, :, :], axis=2)
    np.testing.assert_allclose(ground_cost(x, y, "chordal"), expected, rtol=1e-12, atol=1e-7)


@pytest.mark.parametrize("metric", ["cosine", "sqeuclidean", "euclidean", "chordal"])
def test_ground_cost_is_pots_dist_bit_for_bit(metric):
    """The cost matrices are written out in numpy (no POT import where no plan is solved), with
    POT's arithmetic: W, τ and the noise keep their bits. The Euclidean costs are POT's on the
    centred (and, for chordal, normalised) clouds."""
    from sklearn.preprocessing import normalize

    rng = np.random.default_rng(7)
    for trial in range(60):
        n, m, d = rng.integers(1, 70, size=3)
        x = rng.normal(size=(n, d)) * rng.uniform(0.01, 100) + rng.normal() * 10
        y = rng.normal(size=(m, d)) * 3
        if trial % 3 == 0:
            x = x.astype(np.float32)
        x = x.astype(np.float64)
        if metric == "cosine":
            expected = ot.dist(x, y, metric="cosine")
        else:
            a, b = (normalize(x), normalize(y)) if metric == "chordal" else (x, y)
            centre = 0.5 * (a.mean(axis=0) + b.mean(axis=0))
            expected = np.maximum(ot.dist(a - centre, b - centre, metric="sqeuclidean"), 0.0)
            if metric != "sqeuclidean":
                expected = np.sqrt(expected)
        np.testing.assert_array_equal(ground_cost(x, y, metric), expected)


def test_pot_loads_without_its_other_array_backends_and_optional_imports():
    """POT, loaded through cfl_mpi, imports neither torch nor jax for backends it never gets,
    nor scikit-learn or networkx for solvers the package never calls, nor scipy.stats for its
    toy data sets; all import normally after, POT's data sets too."""
    import subprocess
    import sys

    code = (
        "import sys; from cfl_mpi.ot.pot import ot; "
        "unused = ('torch', 'jax', 'cupy', 'tensorflow', 'sklearn', 'networkx', 'scipy.stats'); "
        "print(sorted(m for m in unused if m in sys.modules)); "
        "import sklearn.cluster, networkx, ot.datasets; print(ot.emd2([0.5, 0.5], [1.0], [[1.0], [3.0]])); "
        "print(ot.datasets.make_1D_gauss(5, 2, 1).shape)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "2.0", "(5,)"]


@pytest.mark.parametrize("metric", ["cosine", "sqeuclidean", "euclidean", "chordal"])
def test_ground_costs_of_a_stack_are_each_pairs_ground_cost_bit_for_bit(metric):
    from cfl_mpi.ot.wasserstein import ground_costs

    rng = np.random.default_rng(11)
    for k, n, m, d in [(1, 5, 5, 3), (7, 91, 91, 57), (4, 29, 58, 12), (3, 2, 9, 130)]:
        xs = (rng.normal(size=(k, n, d)) * 4 + 2).astype(np.float32)
        ys = rng.normal(size=(k, m, d)).astype(np.float32)
        batched = ground_costs(xs, ys, metric)
        for j in range(k):
            np.testing.assert_array_equal(batched[j], ground_cost(xs[j], ys[j], metric))
