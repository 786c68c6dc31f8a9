"""FedWaD (cfl_mpi.ot.fedwad) against exact OT, and the paper's Theorems 1-3.

Rakotomamonjy, Nadjahi, Ralaivola, Federated Wasserstein Distance, ICLR 2024.
Reference distances come from POT's ``ot.emd2`` on the full samples. Sizes stay small
(n ≤ 300) so the file runs in well under a minute on one core.

Some claims do not hold as one might read them; the tests say so explicitly (strict xfail,
or an assertion of what does hold) instead of loosening a tolerance:

* Theorem 2's monotonicity is a property of *exact* interpolating measures (its proof uses
  Eq. 4). The barycentric approximation (Eq. 10) is not on a geodesic and the upper bound
  can go up from one iteration to the next when the two clouds differ in size.
* Theorem 2's convergence to Wp(μ, ν) fails in 50 dimensions: Algorithm 1 settles, after a
  handful of iterations, on a fixed point ξ that is the midpoint of a non-optimal coupling
  of μ and ν, and the bound then stays several per cent above Wp(μ, ν) for good.
* Theorem 3's "one iteration is enough" is about the server-side 2 W2(ξ_μ(1), ξ_ν(1)); the
  Algorithm 1 output W2(μ, ξ(1)) + W2(ξ(1), ν) is still far above W2 after one iteration.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import ot
import pytest

from cfl_mpi.ot.fedwad import (
    FedWaDResult,
    Measure,
    as_measure,
    client_distance,
    client_step,
    fedwad,
    interpolate,
    interpolation_times,
    optimal_plan,
    server_step,
    wasserstein,
)

MONOTONE_RTOL = 1e-9  # allowed relative increase of the bound between two iterations


def _clouds(d: int, n: int, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """μ ~ N(0, I_d), ν ~ N(δ, I_d) with ||δ|| = 3."""
    rng = np.random.default_rng(seed)
    shift = np.full(d, 3.0 / np.sqrt(d))
    return rng.normal(size=(n, d)), rng.normal(size=(m, d)) + shift


def _pot_w(x: np.ndarray, y: np.ndarray, p: int) -> float:
    """Wp between two uniform clouds with POT directly (W2 = sqrt of the OT cost)."""
    metric = "euclidean" if p == 1 else "sqeuclidean"
    a, b = np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y))
    return float(ot.emd2(a, b, ot.dist(x, y, metric=metric))) ** (1 / p)


@cache
def _exact_w(d: int, n: int, m: int, p: int) -> float:
    return _pot_w(*_clouds(d, n, m), p)


@cache
def _run(d: int, n: int, m: int, p: int, method: str, support: int, t="0.5", k: int = 10):
    x, y = _clouds(d, n, m)
    t_arg = "random" if t == "random" else float(t)
    return fedwad(x, y, p=p, n_iter=k, t=t_arg, method=method, support_size=support, seed=7)


def _rel_err(res: FedWaDResult, w: float) -> float:
    return (res.distance - w) / w


def _max_rel_increase(bounds: np.ndarray) -> float:
    return float(np.max(np.diff(bounds) / bounds[:-1]))


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("p", [1, 2])
def test_wasserstein_matches_pot(p):
    x, y = _clouds(3, 40, 25)
    assert wasserstein(x, None, y, None, p=p) == pytest.approx(_pot_w(x, y, p), rel=1e-9)


def test_wasserstein_is_translation_invariant_far_from_origin():
    # ot.dist's |x|²+|y|²-2x·y expansion alone would lose ~all digits at 1e7 from the origin.
    x, y = _clouds(2, 50, 50)
    far = np.array([3e7, -2e7])
    assert wasserstein(x + far, None, y + far, None) == pytest.approx(wasserstein(x, None, y, None), rel=1e-6)


@pytest.mark.parametrize("method", ["exact", "approx"])
def test_interpolating_measure_sits_on_the_geodesic_for_equal_sizes(method):
    # Eq. 4: W(μ0, μt) = t W(μ0, μ1) and W(μt, μ1) = (1 - t) W(μ0, μ1).
    x, y = _clouds(2, 60, 60)
    xt, d01 = interpolate(x, y, 0.3, p=2, method=method)
    assert np.isclose(xt.weights.sum(), 1.0)
    assert wasserstein(x, None, *xt) == pytest.approx(0.3 * d01, rel=1e-9)
    assert wasserstein(*xt, y, None) == pytest.approx(0.7 * d01, rel=1e-9)


def test_approx_interpolation_keeps_the_smaller_support():
    x, y = _clouds(2, 50, 20)
    assert interpolate(x, y, 0.5)[0].size == 20
    assert interpolate(y, x, 0.5)[0].size == 20
    assert interpolate(x, y, 0.5, keep="first")[0].size == 50


def test_exact_support_does_not_explode_from_round_off():
    # Exact interpolation along permutation plans keeps n atoms; simplex round-off kept as
    # atoms used to blow this up to thousands within ten iterations.
    res = _run(2, 120, 120, 1, "exact", 10)
    assert res.support_sizes[-1] == 120
    # unequal sizes: every weight is a multiple of 1/lcm(240, 80, 10), so at most 240 atoms
    assert _run(2, 240, 80, 2, "exact", 10).support_sizes.max() <= 240


def test_per_party_steps_compose_to_fedwad():
    """The distributed protocol (silo / server / silo steps) gives what fedwad() gives."""
    x, y = _clouds(2, 80, 40)
    rng = np.random.default_rng(3)
    xi0 = Measure(rng.normal(size=(8, 2)), np.full(8, 1 / 8))
    times = interpolation_times(4, "random", np.random.default_rng(11))
    xi = xi0
    for t in times:
        xi_mu, _ = client_step(as_measure(x), xi, t, p=1)
        xi_nu, _ = client_step(as_measure(y), xi, t, p=1)
        xi, _ = server_step(xi_mu, xi_nu, t, p=1)
    total = client_distance(x, xi, p=1) + client_distance(y, xi, p=1)
    res = fedwad(x, y, p=1, n_iter=4, t="random", init=xi0, seed=np.random.default_rng(11))
    np.testing.assert_array_equal(res.times, times)
    np.testing.assert_allclose(res.xi.points, xi.points)
    assert res.distance == pytest.approx(total, rel=1e-12)


def test_result_is_frozen_and_consistent():
    res = _run(2, 60, 30, 2, "approx", 10, "random", 5)
    assert res.bounds.shape == (6,) and res.times.shape == (5,)
    assert res.distance == res.bounds[-1]
    assert np.all((res.times > 0) & (res.times < 1))
    with pytest.raises(AttributeError):
        res.distance = 0.0
    with pytest.raises(ValueError):
        res.bounds[0] = 0.0
    # seeded: same seed, same run
    x, y = _clouds(2, 60, 30)
    again = fedwad(x, y, p=2, n_iter=5, t="random", support_size=10, seed=7)
    np.testing.assert_array_equal(again.bounds, res.bounds)


# --------------------------------------------------------------------------- non-finite input


@pytest.mark.parametrize("where", ["mu", "nu_weights", "init", "xi"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input_raises(where, bad):
    x, y = _clouds(2, 20, 10)
    init = np.zeros((4, 2))
    nu_w = np.full(10, 0.1)
    if where == "mu":
        x[3, 1] = bad
    elif where == "nu_weights":
        nu_w[2] = bad
    else:
        init[1, 0] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        if where == "xi":
            client_step(x, init, 0.5)
        else:
            fedwad(x, (y, nu_w), init=init, n_iter=2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"p": 3}, "p must be"),
        ({"t": 1.0}, "strictly between"),
        ({"t": "sometimes"}, "'random'"),
        ({"method": "sinkhorn"}, "method"),
    ],
)
def test_bad_parameters_raise(kwargs, match):
    x, y = _clouds(2, 10, 10)
    with pytest.raises(ValueError, match=match):
        fedwad(x, y, n_iter=1, **kwargs)


def test_bad_measures_raise():
    x, y = _clouds(2, 10, 10)
    with pytest.raises(ValueError, match="sum to 1"):
        fedwad((x, np.full(10, 0.2)), y)
    with pytest.raises(ValueError, match="non-negative"):
        fedwad((x, np.r_[-0.1, np.full(9, 1.1 / 9)]), y)
    with pytest.raises(ValueError, match="different dimensions"):
        fedwad(x, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="shape"):
        fedwad(x[:, 0], y)


# --------------------------------------------------------------------------- Theorem 2


@pytest.mark.parametrize("d", [2, 50])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("t", ["0.5", "random"])
@pytest.mark.parametrize("sizes", [(120, 120), (240, 80)])
def test_exact_bound_is_non_increasing_upper_bound(d, p, t, sizes):
    res = _run(d, *sizes, p, "exact", 10, t)
    assert _max_rel_increase(res.bounds) <= MONOTONE_RTOL
    assert np.all(res.bounds >= _exact_w(d, *sizes, p) * (1 - 1e-9))  # triangle inequality


@pytest.mark.parametrize("d", [2, 50])
@pytest.mark.parametrize("p", [1, 2])
def test_approx_bound_is_non_increasing_in_the_theorem1_regime(d, p):
    # n = m = S with uniform weights: Eq. 10 is Eq. 5 (Theorem 1), so Theorem 2 applies.
    res = _run(d, 120, 120, p, "approx", 120, "random")
    assert _max_rel_increase(res.bounds) <= MONOTONE_RTOL


@pytest.mark.xfail(
    strict=True,
    reason="Theorem 2 needs exact interpolating measures (Eq. 4); the barycentric "
    "approximation of Eq. 10 is off the geodesic when the clouds differ in size, and the "
    "bound can rise (here by 2e-4 relative at t = 0.5, by 10 % with random t)",
)
@pytest.mark.parametrize("t", ["0.5", "random"])
def test_approx_bound_is_non_increasing_in_general(t):
    res = _run(2, 240, 80, 1, "approx", 10, t)
    assert _max_rel_increase(res.bounds) <= MONOTONE_RTOL


# --------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("sizes", [(150, 150), (240, 80)])
@pytest.mark.parametrize("method", ["exact", "approx"])
def test_relative_error_2d_after_10_iterations(p, sizes, method):
    # exact: ξ(0) of 10 points, support grows; approx: S ≥ both cloud sizes.
    support = 10 if method == "exact" else max(sizes)
    res = _run(2, *sizes, p, method, support)
    w = _exact_w(2, *sizes, p)
    assert 0 <= _rel_err(res, w) <= 0.01 + 1e-12


@pytest.mark.xfail(
    strict=True,
    reason="not in the paper (Appendix D.1 expects poor estimates in 50-D) and false: "
    "Algorithm 1 stalls at a fixed point off the μ-ν geodesic, about 5-12 % above Wp",
)
@pytest.mark.parametrize("method", ["exact", "approx"])
def test_relative_error_50d_after_10_iterations(method):
    support = 10 if method == "exact" else 120
    res = _run(50, 120, 120, 2, method, support)
    assert _rel_err(res, _exact_w(50, 120, 120, 2)) <= 0.01


def test_50d_stall_is_a_fixed_point_off_the_geodesic():
    """Why the 50-D claim fails: the bound stops moving while far above W2.

    Once the plans μ→ξ and ξ→ν are permutations σ, τ and the server's plan is the identity,
    ξ(k) tends to the midpoints of the coupling τ∘σ⁻¹ of μ and ν, and stays there: in high
    dimension every midpoint is much closer to its own two endpoints than to any other
    point, so no plan changes. The limit is sqrt(cost of that coupling) ≥ W2, with equality
    only if the coupling is optimal; Theorem 2's proof assumes the fixed point lies on the
    μ-ν geodesic without showing it.
    """
    res = _run(50, 120, 120, 2, "exact", 10, "0.5", 25)
    w = _exact_w(50, 120, 120, 2)
    assert res.bounds[-1] == pytest.approx(res.bounds[12], rel=1e-6)  # stationary
    assert _rel_err(res, w) > 0.02
    # the limit is the cost of the coupling of μ and ν obtained through ξ(K)
    x, y = _clouds(50, 120, 120)
    a = np.full(120, 1 / 120)
    to_xi, _ = optimal_plan(x, a, res.xi.points, res.xi.weights, p=2)
    from_xi, _ = optimal_plan(res.xi.points, res.xi.weights, y, a, p=2)
    coupling = to_xi @ (from_xi / res.xi.weights[:, None])  # a plan between μ and ν
    np.testing.assert_allclose(coupling.sum(axis=1), a)
    coupling_cost = np.sqrt(np.sum(coupling * ot.dist(x, y)))
    assert res.distance == pytest.approx(coupling_cost, rel=1e-6)


# --------------------------------------------------------------------------- Theorem 1


@pytest.mark.parametrize("p", [1, 2])
def test_theorem1_approx_equals_exact_for_equal_size_uniform(p):
    x, y = _clouds(2, 70, 70, seed=5)
    for t in (0.2, 0.5, 0.9):
        approx, d_a = interpolate(x, y, t, p=p, method="approx")
        exact, d_e = interpolate(x, y, t, p=p, method="exact")
        assert exact.size == approx.size == 70
        order_a, order_e = np.lexsort(approx.points.T), np.lexsort(exact.points.T)
        np.testing.assert_allclose(approx.points[order_a], exact.points[order_e], atol=1e-12)
        np.testing.assert_allclose(approx.weights[order_a], exact.weights[order_e], atol=1e-15)
        assert d_a == d_e
    # and over a whole run with ξ(0) of the same size
    xi0 = np.random.default_rng(1).normal(size=(70, 2))
    runs = [fedwad(x, y, p=p, method=m, init=xi0, n_iter=5) for m in ("approx", "exact")]
    np.testing.assert_allclose(runs[0].bounds, runs[1].bounds, rtol=1e-12)


def test_theorem1_needs_equal_sizes():
    # the check above is not vacuous: with n ≠ m the two interpolations differ
    x, y = _clouds(2, 60, 20)
    approx = interpolate(x, y, 0.5, method="approx")[0]
    exact = interpolate(x, y, 0.5, method="exact")[0]
    assert approx.size == 20 and exact.size > 20


# --------------------------------------------------------------------------- Theorem 3


def test_theorem3_equal_covariance_gaussians():
    """μ, ν, ξ(0) Gaussian with one covariance Σ, t = 0.5, squared Euclidean cost.

    Point 2: W2(μ, ν) = 2 W2(ξ_μ(1), ξ_ν(1)), so the *server* knows W2 after one iteration
    (this is what "only one iteration is needed" means). The Algorithm 1 output
    W2(μ, ξ(k)) + W2(ξ(k), ν) does not equal W2 after one iteration; it obeys point 4:
    it exceeds W2 by at most 2^-(k-1) W2(ξ(0), ξ*).
    """
    rng = np.random.default_rng(2)
    n = 300
    chol = np.linalg.cholesky(np.array([[1.0, 0.6], [0.6, 0.8]]))
    m_mu, m_nu, m_xi = np.array([0.0, 0.0]), np.array([6.0, 0.0]), np.array([1.0, 5.0])
    mu = m_mu + rng.normal(size=(n, 2)) @ chol.T
    nu = m_nu + rng.normal(size=(n, 2)) @ chol.T
    xi0 = m_xi + rng.normal(size=(n, 2)) @ chol.T
    res = fedwad(mu, nu, p=2, t=0.5, n_iter=4, method="approx", init=xi0)

    w_true = float(np.linalg.norm(m_mu - m_nu))  # closed form for a common covariance
    w_emp = wasserstein(mu, None, nu, None, p=2)
    assert 2 * res.server_distances[0] == pytest.approx(w_emp, rel=1e-2)
    assert 2 * res.server_distances[0] == pytest.approx(w_true, rel=5e-2)  # sampling error

    gap0 = float(np.linalg.norm(m_xi - 0.5 * (m_mu + m_nu)))  # W2(ξ(0), ξ*)
    for k in range(1, 5):
        assert res.bounds[k] - w_true <= 2.0 ** (1 - k) * gap0 + 0.05 * w_true
    assert res.bounds[1] > 1.2 * w_emp  # one iteration is not enough for the bound itself
