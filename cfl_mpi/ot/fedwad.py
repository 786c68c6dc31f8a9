"""FedWaD: the Wasserstein distance between two measures that never meet.

Rakotomamonjy, Nadjahi & Ralaivola, *Federated Wasserstein Distance*, ICLR 2024. μ lives on
one silo, ν on another; the server only ever sees *interpolating measures* ξ and, at the very
end, two scalars.

Algorithm 1, with k = 1..K and a time t ∈ (0, 1)::

    silo of μ :  ξ_μ(k) = interp(μ, ξ(k-1), t)          (also yields Wp(μ, ξ(k-1)))
    silo of ν :  ξ_ν(k) = interp(ν, ξ(k-1), t)          (also yields Wp(ν, ξ(k-1)))
    server    :  ξ(k)   = interp(ξ_μ(k), ξ_ν(k), t)
    finally   :  Wp(μ, ν) ≈ Wp(μ, ξ(K)) + Wp(ξ(K), ν)

``interp`` is either

* the exact McCann interpolation (Eq. 5): ``Σ_ij P*_ij δ_{(1-t) x_i + t y_j}`` over the
  non-zero entries of an optimal plan P*. Its support grows from iteration to iteration;
* the approximate one (Eq. 10, the default): the barycentric map ``T(x_i) = (P* Y)_i / a_i``
  replaces the plan, ``Σ_i a_i δ_{(1-t) x_i + t T(x_i)}``, and the support stays that of the
  smaller of the two measures, so ξ(k) keeps the support size S of ξ(0) (when S ≤ n, m).

Exact interpolation lies on a Wasserstein geodesic (Eq. 4), so ``Wp(μ, ξ(k)) + Wp(ξ(k), ν)``
is an upper bound of Wp(μ, ν) that never increases with k (Theorem 2). The approximate
interpolation is exact for equal-size uniform measures (Theorem 1), not in general.

Everything here works on plain numpy arrays: a measure is ``points`` (n, d) float64 plus
``weights`` (n,) summing to 1 (:class:`Measure` is a named tuple of the two). The per-party
steps :func:`client_step`, :func:`server_step` and :func:`client_distance` are what a
distributed protocol calls; :func:`fedwad` runs the whole loop locally with those same steps.

Ground cost: p = 1 uses the Euclidean distance, p = 2 the squared Euclidean distance, and in
both cases Wp is ``(min_P <C, P>)^(1/p)`` (Eq. 1-2): for p = 2 every distance returned here is
W2 itself (the square root of the OT cost), never W2².

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> mu, nu = rng.normal(size=(200, 2)), rng.normal(size=(100, 2)) + 3.0
    >>> res = fedwad(mu, nu, p=2, n_iter=10, support_size=10, seed=0)
    >>> res.distance >= wasserstein(mu, np.full(200, 1 / 200), nu, np.full(100, 1 / 100))
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NamedTuple

import numpy as np

from .wasserstein import ground_cost

__all__ = [
    "Measure",
    "FedWaDResult",
    "as_measure",
    "uniform_measure",
    "gaussian_measure",
    "optimal_plan",
    "wasserstein",
    "interpolate",
    "interpolation_times",
    "client_step",
    "server_step",
    "client_distance",
    "fedwad",
]

Method = Literal["approx", "exact"]
Keep = Literal["smaller", "first", "second"]

# Largest common denominator L for which weights are handed to the LP solver as integer
# masses (weights * L): sums of integers below 2^53 are exact in float64, so the network
# simplex then returns an exactly integral plan whose zeros are exact zeros.
_MAX_COMMON_DENOMINATOR = 2**40
# Otherwise (weights that are no small-denominator fractions) a plan entry below this mass
# (measures have unit mass) is a round-off residue of the simplex and is set to zero.
_PLAN_ZERO_ATOL = 1e-12
# Weights may differ from a unit sum by this much (round-off); beyond, it is a caller bug.
_WEIGHT_SUM_TOL = 1e-6
# Network-simplex iteration cap: far above what n, m ≤ 10^4 need, so hitting it is an error.
_EMD_MAX_ITER = 50_000_000


class Measure(NamedTuple):
    """A discrete probability measure ``Σ_i weights[i] δ_{points[i]}``."""

    points: np.ndarray  # (n, d) float64
    weights: np.ndarray  # (n,) float64, non-negative, sums to 1

    @property
    def size(self) -> int:
        return int(self.points.shape[0])

    @property
    def dim(self) -> int:
        return int(self.points.shape[1])


@dataclass(frozen=True)
class FedWaDResult:
    """What :func:`fedwad` returns. Arrays are read-only.

    ``distance`` is ``Wp(μ, ξ(K)) + Wp(ξ(K), ν)``, the FedWaD estimate of Wp(μ, ν)
    (Algorithm 1, line 10). ``bounds[k] = Wp(μ, ξ(k)) + Wp(ξ(k), ν)`` for k = 0..K, so
    ``bounds[-1] == distance``: each is an upper bound of Wp(μ, ν) (triangle inequality,
    Eq. 3). With exact interpolation the sequence is non-increasing: Theorem 2 proves it for
    the four-term A(k) = Wp(μ, ξ_μ) + Wp(ξ_μ, ξ) + Wp(ξ, ξ_ν) + Wp(ξ_ν, ν), and its proof
    shows ``bounds[k] ≤ A(k) ≤ bounds[k-1]``.
    ``server_distances[k-1] = Wp(ξ_μ(k), ξ_ν(k))``, which the server gets for free from its
    own plan; with equal-covariance Gaussians and t = 0.5, ``2 * server_distances[0]``
    is W2(μ, ν) already (Theorem 3, point 2).
    """

    distance: float
    bounds: np.ndarray  # (K+1,)
    server_distances: np.ndarray  # (K,)
    times: np.ndarray  # (K,) the t of each iteration
    support_sizes: np.ndarray  # (K+1,) support size of ξ(k)
    xi: Measure  # ξ(K)
    p: int
    method: str


# --------------------------------------------------------------------------- measures


def as_measure(points, weights=None, *, name: str = "measure") -> Measure:
    """Validate ``points`` (n, d) and ``weights`` (n,) and return a float64 :class:`Measure`.

    ``weights=None`` means uniform. Weights must be finite, non-negative and sum to 1 up to
    round-off; they are renormalised to sum to 1 exactly (the LP solver checks marginals).
    Raises ValueError on NaN/inf, wrong shapes or an empty measure.
    """
    x = np.asarray(points, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: points must have shape (n, d) with n, d >= 1, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: points contain NaN or inf")
    n = x.shape[0]
    if weights is None:
        return Measure(x, np.full(n, 1.0 / n))
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"{name}: weights must have shape ({n},), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name}: weights contain NaN or inf")
    if np.any(w < 0):
        raise ValueError(f"{name}: weights must be non-negative")
    total = float(w.sum())
    if abs(total - 1.0) > _WEIGHT_SUM_TOL:
        raise ValueError(f"{name}: weights must sum to 1, they sum to {total!r}")
    return Measure(x, w / total)


def uniform_measure(points) -> Measure:
    """The empirical measure of ``points``: weight 1/n on each row."""
    return as_measure(points)


def gaussian_measure(support_size: int, dim: int, rng: np.random.Generator, *, loc=0.0, scale: float = 1.0) -> Measure:
    """ξ(0) as in the paper's experiments: ``support_size`` draws of N(loc, scale² I), uniform."""
    if support_size < 1 or dim < 1:
        raise ValueError(f"support_size and dim must be >= 1, got {support_size}, {dim}")
    pts = np.asarray(loc, dtype=np.float64) + scale * rng.standard_normal((support_size, dim))
    return as_measure(pts, name="xi0")


def _measure(m, name: str) -> Measure:
    """Accept a Measure, a (points, weights) pair or a bare points array."""
    if isinstance(m, tuple) and len(m) == 2:
        return as_measure(m[0], m[1], name=name)
    return as_measure(m, name=name)


# --------------------------------------------------------------------------- OT core


def _check_p(p: int) -> int:
    if p not in (1, 2):
        raise ValueError(f"p must be 1 (Euclidean cost) or 2 (squared Euclidean cost), got {p!r}")
    return int(p)


def _integer_masses(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(a * L, b * L, L)`` with integer masses when all weights are fractions k / L.

    Uniform empirical measures (1/n), the Eq. 10 interpolations (which keep those weights)
    and the Eq. 5 interpolations built from them (plan entries, multiples of
    1 / lcm(n, m, S)) all qualify. Returns None when no L ≤ 2^40 fits.
    """
    den = 1
    for w in np.unique(np.concatenate([a, b])):
        frac = Fraction(float(w)).limit_denominator(_MAX_COMMON_DENOMINATOR)
        den = math.lcm(den, frac.denominator)
        if den > _MAX_COMMON_DENOMINATOR:
            return None
    counts = []
    for w in (a, b):
        scaled = w * den
        whole = np.rint(scaled)
        # off-grid weights, or a grid too fine for float64 to tell: use the float path
        if np.abs(whole - scaled).max() > 1e-6 or whole.sum() != den:
            return None
        counts.append(whole)
    return counts[0], counts[1], den


def optimal_plan(x: np.ndarray, a: np.ndarray, y: np.ndarray, b: np.ndarray, p: int = 2) -> tuple[np.ndarray, float]:
    """An optimal plan P* of Eq. 2 between ``(x, a)`` and ``(y, b)``, and Wp = <C, P*>^(1/p).

    Uses POT's network simplex (``ot.emd``) with two precautions:

    * the cost is divided by its maximum (the plan does not change; the solver is best
      conditioned on costs of order 1); the distance uses the unscaled cost;
    * weights that are fractions k / L (uniform empirical measures and everything FedWaD
      derives from them) are passed as the integers k: the simplex is then exact, and an
      entry of P* is zero exactly when it should be. Otherwise round-off residues (below
      1e-12 of the unit mass) are zeroed. Without this, the residues of one iteration
      become atoms of the next exact interpolation (Eq. 5), split the following plans, and
      the support explodes within a few iterations: the "numerical errors" the paper sees
      growing with the support of the exact interpolation (Section 4, Figure 3).

    Two uniform measures of equal size (what Eq. 10 keeps passing around when S = n = m) have
    a permutation among their optimal plans (Birkhoff), found by scipy's assignment solver in
    about half the time of the simplex; its entries are exactly 1/n or 0.

    Raises RuntimeError when the solver does not report an optimal solution.
    """
    from .solvers import linear_sum_assignment, ot  # here: the silos of most runs never solve a plan

    cost = ground_cost(x, y, "euclidean" if p == 1 else "sqeuclidean")  # C_ij = ||x_i - y_j||^p (Eq. 2)
    scale = float(cost.max())
    if not math.isfinite(scale):
        raise ValueError("ground cost overflowed (points too large for float64)")
    scaled = cost / scale if scale > 0 else cost
    if a.shape == b.shape and np.all(a == a[0]) and np.all(b == b[0]):
        rows, cols = linear_sum_assignment(scaled)
        plan = np.zeros_like(cost)
        plan[rows, cols] = a[0]
        log = {"result_code": 1}
    elif (masses := _integer_masses(a, b)) is not None:
        ia, ib, den = masses
        plan, log = ot.emd(ia, ib, scaled, numItermax=_EMD_MAX_ITER, log=True)
        plan = np.rint(plan) / den
    else:
        plan, log = ot.emd(a, b, scaled, numItermax=_EMD_MAX_ITER, log=True)
        plan[plan < _PLAN_ZERO_ATOL] = 0.0
    if log.get("result_code") != 1:
        raise RuntimeError(
            f"ot.emd did not reach an optimal plan (code {log.get('result_code')}): {log.get('warning')}"
        )
    total = max(float(np.sum(plan * cost)), 0.0)
    return plan, total ** (1.0 / p)


def wasserstein(x, a, y, b, p: int = 2) -> float:
    """Exact Wp between ``(x, a)`` and ``(y, b)`` (Eq. 1-2); W2 is the root of the OT cost."""
    mx, my = as_measure(x, a, name="first"), as_measure(y, b, name="second")
    _same_dim(mx, my)
    return optimal_plan(mx.points, mx.weights, my.points, my.weights, _check_p(p))[1]


def _same_dim(m1: Measure, m2: Measure) -> None:
    if m1.dim != m2.dim:
        raise ValueError(f"measures live in different dimensions: {m1.dim} vs {m2.dim}")


# --------------------------------------------------------------------------- interpolation


def _check_t(t: float) -> float:
    t = float(t)
    if not (0.0 <= t <= 1.0):
        raise ValueError(f"interpolation time t must lie in [0, 1], got {t!r}")
    return t


def _exact_interpolation(x, y, plan, t) -> Measure:
    """Eq. 5: mass P*_ij at (1-t) x_i + t y_j, one atom per non-zero plan entry."""
    rows, cols = np.nonzero(plan)
    mass = plan[rows, cols]
    points = (1.0 - t) * x[rows] + t * y[cols]
    return Measure(points, mass / mass.sum())


def _barycentric_map(x, a, plan, y) -> np.ndarray:
    """T(x_i) = Σ_j P*_ij y_j / a_i (Courty et al., 2018); atoms without mass stay put."""
    moved = plan @ y
    has_mass = a > 0
    out = x.copy()
    out[has_mass] = moved[has_mass] / a[has_mass, None]
    return out


def _approx_interpolation(x, a, y, b, plan, t, keep: Keep) -> Measure:
    """Eq. 10 on the support of the first (or second) measure.

    On the first: ``Σ_i a_i δ_{(1-t) x_i + t T(x_i)}``; on the second, symmetrically,
    ``Σ_j b_j δ_{(1-t) T'(y_j) + t y_j}`` with T' the barycentric map of Pᵀ. "smaller" picks
    the smaller support, as the paper does in practice (ties: the first).
    """
    if keep == "smaller":
        keep = "first" if x.shape[0] <= y.shape[0] else "second"
    if keep == "first":
        target = _barycentric_map(x, a, plan, y)
        return Measure((1.0 - t) * x + t * target, a.copy())
    if keep == "second":
        source = _barycentric_map(y, b, plan.T, x)
        return Measure((1.0 - t) * source + t * y, b.copy())
    raise ValueError(f"keep must be 'smaller', 'first' or 'second', got {keep!r}")


def interpolate(
    first,
    second,
    t: float = 0.5,
    *,
    p: int = 2,
    method: Method = "approx",
    keep: Keep = "smaller",
) -> tuple[Measure, float]:
    """Interpolating measure at time t from ``first`` (t = 0) to ``second`` (t = 1).

    ``first``/``second``: a :class:`Measure`, a ``(points, weights)`` pair or a points array
    (uniform weights). ``method="exact"`` is Eq. 5 (support = non-zero entries of the plan,
    at most n + m - 1 atoms); ``method="approx"`` is Eq. 10 (support of the smaller input, or
    of the one named by ``keep``). The optimal plan for the cost of order p is computed once
    and also gives ``Wp(first, second)``, returned alongside: ``(measure, distance)``.
    """
    m1, m2 = _measure(first, "first"), _measure(second, "second")
    _same_dim(m1, m2)
    t, p = _check_t(t), _check_p(p)
    plan, dist = optimal_plan(m1.points, m1.weights, m2.points, m2.weights, p)
    if method == "exact":
        out = _exact_interpolation(m1.points, m2.points, plan, t)
    elif method == "approx":
        out = _approx_interpolation(m1.points, m1.weights, m2.points, m2.weights, plan, t, keep)
    else:
        raise ValueError(f"method must be 'approx' or 'exact', got {method!r}")
    return out, dist


def interpolation_times(
    n_iter: int, t: float | Literal["random"] | np.ndarray = 0.5, rng: np.random.Generator | None = None
) -> np.ndarray:
    """The t of each of the ``n_iter`` iterations: all equal to ``t``, ``"random"``: one
    independent draw of U(0, 1) per iteration from ``rng`` (the three interpolations of an
    iteration share it), or given, one per iteration, each in (0, 1)."""
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    if isinstance(t, np.ndarray):
        if t.shape != (n_iter,) or not np.all((t > 0.0) & (t < 1.0)):
            raise ValueError(f"t: expected {n_iter} times strictly between 0 and 1, got {t!r}")
        return t.astype(np.float64)
    if isinstance(t, str):
        if t != "random":
            raise ValueError(f"t must be a float in (0, 1) or 'random', got {t!r}")
        if rng is None:
            raise ValueError("t='random' needs a numpy Generator (pass seed= or rng=)")
        times = rng.uniform(0.0, 1.0, size=n_iter)
        while np.any(times == 0.0):  # U[0, 1) can return exactly 0: redraw those
            zero = times == 0.0
            times[zero] = rng.uniform(0.0, 1.0, size=int(zero.sum()))
        return times
    t = float(t)
    if not (0.0 < t < 1.0):
        raise ValueError(f"t must lie strictly between 0 and 1, got {t!r}")
    return np.full(n_iter, t)


# --------------------------------------------------------------------------- per-party steps


def client_step(own, xi, t: float, *, p: int = 2, method: Method = "approx") -> tuple[Measure, float]:
    """Silo side of iteration k (Algorithm 1, lines 4-5).

    ``own`` is the silo's private measure (μ or ν), ``xi`` the ξ(k-1) received from the
    server. Returns ``(ξ_own(k), Wp(own, ξ(k-1)))``: the interpolating measure at time t
    from ``own`` to ξ(k-1), to send to the server, and the distance that came with the plan
    (the "optional return of distances" of Algorithm 1; keep it on the silo if the protocol
    reveals distances only at the end).
    """
    return interpolate(own, xi, t, p=p, method=method)


def server_step(xi_mu, xi_nu, t: float, *, p: int = 2, method: Method = "approx") -> tuple[Measure, float]:
    """Server side of iteration k (Algorithm 1, line 7): ξ(k) = interp(ξ_μ(k), ξ_ν(k), t).

    Returns ``(ξ(k), Wp(ξ_μ(k), ξ_ν(k)))``.
    """
    return interpolate(xi_mu, xi_nu, t, p=p, method=method)


def client_distance(own, xi, *, p: int = 2) -> float:
    """Silo side of the last step (Algorithm 1, line 9): Wp(own, ξ(K))."""
    m1, m2 = _measure(own, "own"), _measure(xi, "xi")
    _same_dim(m1, m2)
    return optimal_plan(m1.points, m1.weights, m2.points, m2.weights, _check_p(p))[1]


# --------------------------------------------------------------------------- local driver


def _frozen(a, dtype=np.float64) -> np.ndarray:
    """A read-only copy, so that a frozen result is frozen all the way down."""
    arr = np.array(a, dtype=dtype)
    arr.flags.writeable = False
    return arr


def fedwad(
    mu,
    nu,
    *,
    p: int = 2,
    n_iter: int = 10,
    t: float | Literal["random"] | np.ndarray = 0.5,
    method: Method = "approx",
    support_size: int = 10,
    init=None,
    seed: int | np.random.Generator | None = None,
) -> FedWaDResult:
    """Run Algorithm 1 locally, with the same per-party steps a distributed run uses.

    Parameters
    ----------
    mu, nu : Measure, ``(points, weights)`` pair, or points array (n, d) (uniform weights).
    p : 1 (Euclidean cost, W1) or 2 (squared Euclidean cost; W2 = root of the OT cost).
    n_iter : K, the number of iterations (K = 0 evaluates ξ(0) only).
    t : a fixed time in (0, 1) (0.5 in the paper's theory), ``"random"`` for one U(0, 1)
        draw per iteration from the seeded Generator, or an array of the K times.
    method : ``"approx"`` (Eq. 10, fixed support, default) or ``"exact"`` (Eq. 5).
    support_size : S, the size of the random ξ(0) when ``init`` is None.
    init : ξ(0) as a Measure / pair / points array; None draws S points of N(0, I_d).
    seed : int or Generator for ξ(0) and random t.

    The whole run costs 3K + 2 OT problems: each iteration's client steps return
    Wp(μ, ξ(k-1)) and Wp(ξ(k-1), ν) with their interpolation, so ``bounds`` comes free.
    """
    m_mu, m_nu = _measure(mu, "mu"), _measure(nu, "nu")
    _same_dim(m_mu, m_nu)
    p = _check_p(p)
    if method not in ("approx", "exact"):
        raise ValueError(f"method must be 'approx' or 'exact', got {method!r}")
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if init is None:
        xi = gaussian_measure(support_size, m_mu.dim, rng)
    else:
        xi = _measure(init, "init")
        _same_dim(xi, m_mu)
    times = interpolation_times(n_iter, t, rng)

    bounds, server_distances, sizes = [], [], [xi.size]
    for t_k in times:
        xi_mu, d_mu = client_step(m_mu, xi, t_k, p=p, method=method)
        xi_nu, d_nu = client_step(m_nu, xi, t_k, p=p, method=method)
        bounds.append(d_mu + d_nu)  # = Wp(μ, ξ(k-1)) + Wp(ξ(k-1), ν)
        xi, d_server = server_step(xi_mu, xi_nu, t_k, p=p, method=method)
        server_distances.append(d_server)
        sizes.append(xi.size)
    final = client_distance(m_mu, xi, p=p) + client_distance(m_nu, xi, p=p)
    bounds.append(final)

    xi_out = Measure(_frozen(xi.points), _frozen(xi.weights))
    return FedWaDResult(
        distance=float(final),
        bounds=_frozen(bounds),
        server_distances=_frozen(server_distances),
        times=_frozen(times),
        support_sizes=_frozen(sizes, np.int64),
        xi=xi_out,
        p=p,
        method=method,
    )
