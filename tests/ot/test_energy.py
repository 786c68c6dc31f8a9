"""The energy distance (ot/energy.py) against a brute-force reference and scipy, and the
property EMD-CFL's `distance: energy` relies on: unbiased, 0 on average for one distribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import energy_distance as scipy_energy_distance

from cfl_mpi.ot.energy import energy_distance


def brute_force(x: np.ndarray, y: np.ndarray, d) -> float:
    """2 E d(X, Y) − E d(X, X') − E d(Y, Y'), each mean written out over its pairs."""
    between = np.mean([d(a, b) for a in x for b in y])
    own = [np.mean([d(a, b) for a, b in itertools.permutations(z, 2)]) for z in (x, y)]
    return 2 * between - own[0] - own[1]


def chordal(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a / np.linalg.norm(a) - b / np.linalg.norm(b)))


@pytest.mark.parametrize("metric, d", [("euclidean", lambda a, b: float(np.linalg.norm(a - b))), ("chordal", chordal)])
def test_energy_distance_is_the_u_statistic(metric, d):
    rng = np.random.default_rng(0)
    x, y = rng.random((9, 5)), rng.random((6, 5)) + 0.3
    assert energy_distance(x, y, metric) == pytest.approx(brute_force(x, y, d), rel=1e-9)


def test_energy_distance_is_unbiased_where_scipys_v_statistic_is_not():
    """Samples of one distribution: the U-statistic averages 0 (here within 3 standard errors),
    scipy's V-statistic (squared: scipy returns the square root) stays positive. In 1-D the
    Euclidean distance is |x − y|, so both read the same data."""
    rng = np.random.default_rng(1)
    ours, theirs = [], []
    for _ in range(2000):
        x, y = rng.normal(size=7), rng.normal(size=13)
        ours.append(energy_distance(x[:, None], y[:, None], "euclidean"))
        theirs.append(scipy_energy_distance(x, y) ** 2)  # scipy returns sqrt(2 A − B − C)
    ours_mean, ours_se = np.mean(ours), np.std(ours) / np.sqrt(len(ours))
    assert abs(ours_mean) < 3 * ours_se
    assert np.mean(theirs) > 10 * ours_se


def test_energy_distance_matches_scipy_where_v_and_u_agree():
    """With many points the diagonal's share vanishes: U- and V-statistic (scipy) agree."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=3000), rng.normal(loc=1.0, size=2000)
    reference = scipy_energy_distance(x, y) ** 2
    assert energy_distance(x[:, None], y[:, None], "euclidean") == pytest.approx(reference, rel=2e-3)


def test_energy_distance_grows_with_a_shift_and_needs_two_points_a_side():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 4))
    near, far = (energy_distance(x, rng.normal(size=(50, 4)) + s, "euclidean") for s in (0.5, 2.0))
    assert 0 < near < far
    with pytest.raises(ValueError, match="at least 2 points"):
        energy_distance(x[:1], x, "euclidean")
