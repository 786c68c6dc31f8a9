"""EMD-CFL's pair distance: what an entry of W is made of (Alg. 1, line 16), the silo's
reference τ and noise unit it is measured in, and the solvers a party needs for them.

A distance is built once from the parameters (parts.py): `Transport` is W1 by the exact or
the Sinkhorn solver, with τ taken in one of three spaces (`Unprojected`, `FullProjection`,
`PerPair`); `Energy` is the energy distance, which needs no τ. `between` measures a batch of
pairs: the server measures every pair of a message in one call, its cost matrices (or energy
distances) as stacked array arithmetic, each entry the bits of `pair` on its own
(tests/strategies/test_emdcfl_distances.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...ot.energy import energy_distances
from ...ot.wasserstein import (
    GroundCost,
    Solver,
    assignment_sizes,
    ground_cost,
    ground_costs,
    transport_cost,
    w1_repeated,
)
from ...privacy.handshake import random_projection

# Pairs stacked into one array computation at most: a few dozen ~100-point clouds keep the
# stacked distance matrices in the CPU's caches, where hundreds spill out of them and take
# longer per pair than one pair at a time (docs/research/PERFORMANCE.md, "Stacked pair distances").
STACK = 32


def projected_dim(proj_ratio: float, embedding_dim: int) -> int:
    """dim(R) = ⌊proj_ratio · dim(Z)⌋ (proj_ratio 0.9 in the paper and the authors' code)."""
    return int(proj_ratio * embedding_dim)


#: Below this many embeddings in its sample a silo is reported as too small to tell groups apart.
TELL_FLOOR = 30
#: `noise_splits: auto` draws this many halvings where the halves hold fewer than SMALL_HALF
#: embeddings (each draw is cheap there, and the RMS of n draws strays by about 1/√(2n) of the
#: truth: ~7 % at 100), NOISE_DRAWS elsewhere.
NOISE_DRAWS, SMALL_HALF_DRAWS, SMALL_HALF = 30, 100, 32


def sample_size(fraction: float | str, cap: int, n_train: int, n_val: int) -> int:
    """n = min(10 % of the silo's training data, 512) (the paper's §3, complexity paragraph).

    `auto`: the paper's 10 %, or as many as the silo's validation set holds where that is
    more. τ_c, W1 between the sample and the validation set (line 14), cancels W1's sampling
    bias in W[c][c'] (line 16) only where the clouds are of one size: a sample four times the
    validation set's leaves τ too large and same-group silos several noise units below 0,
    which merges groups. On silos of a few hundred examples the paper's 10 % is a dozen
    embeddings, and the validation set then sets the sample (docs/methods/emdcfl.md, "Sample sizes")."""
    n = math.ceil((0.1 if fraction == "auto" else float(fraction)) * n_train)
    if fraction == "auto":
        n = max(n, n_val)
    return max(2, min(n, cap, n_train))


def noise_draws(splits: int | str, half: int) -> int:
    """How many random halvings measure a silo's noise whose halves hold `half` embeddings."""
    if splits != "auto":
        return int(splits)
    return SMALL_HALF_DRAWS if half < SMALL_HALF else NOISE_DRAWS


def evenly_spaced(x: np.ndarray, k: int) -> np.ndarray:
    """k of x's rows spread evenly over it, first and last kept (all of them where k = len(x))."""
    return x if k == len(x) else x[np.linspace(0, len(x) - 1, k).round().astype(np.int64)]


def stacked(xs: list[np.ndarray], ys: list[np.ndarray]) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """The pairs (xs[k], ys[k]) as stacks of equal shapes, at most STACK each: (ks, x, y)."""
    shapes: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for k, (x, y) in enumerate(zip(xs, ys)):
        shapes.setdefault((x.shape, y.shape), []).append(k)
    chunks = [same[i : i + STACK] for same in shapes.values() for i in range(0, len(same), STACK)]
    return [(ks, np.stack([xs[k] for k in ks]), np.stack([ys[k] for k in ks])) for ks in chunks]


class PairDistance(Protocol):
    """The distance W is made of, its silo's reference and noise, and the solvers it loads."""

    @property
    def per_pair_tau(self) -> bool:
        """Whether τ is taken per pair, through the pair's R (`pair_reference`), not per silo."""

    @property
    def modules(self) -> tuple[str, ...]:
        """What the server, which measures the pairs with it, loads before round 1."""

    @property
    def silo_modules(self) -> tuple[str, ...]:
        """What a silo, which takes its τ and noise with it, loads before round 1."""

    def between(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> np.ndarray:
        """The distance of each pair (xs[k], ys[k])."""

    def reference(
        self, z_own: np.ndarray, z_val: np.ndarray, dim_r: int, rng: np.random.Generator
    ) -> tuple[float | None, float]:
        """(τ_c, or None where it is per pair; the silo's noise scale)."""

    def pair_reference(self, zr_own: np.ndarray, z_val: np.ndarray, r: np.ndarray) -> float:
        """τ_{c,c'} through the pair's R (only where `per_pair_tau`)."""


def pair_distance(distance: PairDistance, x: np.ndarray, y: np.ndarray) -> float:
    """One pair's distance: the bits of the same pair measured in a batch."""
    return float(distance.between([x], [y])[0])


class Unprojected:
    """τ_c = W1(Z_{c|c}, Z^val_{c|c}), unprojected (`tau_projection: none`)."""

    per_pair = False

    def in_noise(self, d: Transport, own: np.ndarray, second: np.ndarray, r: np.ndarray) -> float:
        """The reference a null draw subtracts (own: the draw's subset of Z_{c|c}, unprojected)."""
        return pair_distance(d, own, second)

    def of_silo(
        self, d: Transport, z_own: np.ndarray, z_val: np.ndarray, rng: np.random.Generator, projection: str
    ) -> float | None:
        return d.tau_between(z_own, z_val)


class FullProjection(Unprojected):
    """τ_c through a fresh full-rank dim(Z) × dim(Z) projection, drawn after the noise's, as
    the authors' code does (`tau_projection: full`)."""

    def of_silo(
        self, d: Transport, z_own: np.ndarray, z_val: np.ndarray, rng: np.random.Generator, projection: str
    ) -> float | None:
        r = random_projection(rng, z_own.shape[1], z_own.shape[1], projection)
        return d.tau_between(z_own @ r, z_val @ r)


class PerPair:
    """τ_{c,c'} through each pair's own R (`tau_projection: pair`): `pair_reference`."""

    per_pair = True

    def in_noise(self, d: Transport, own: np.ndarray, second: np.ndarray, r: np.ndarray) -> float:
        return pair_distance(d, own @ r, second @ r)

    def of_silo(
        self, d: Transport, z_own: np.ndarray, z_val: np.ndarray, rng: np.random.Generator, projection: str
    ) -> float | None:
        return None


TauSpace = Unprojected | PerPair


@dataclass(frozen=True)
class Transport:
    """W1 between two clouds under `ground_cost`, by the exact or the Sinkhorn solver (FedWaD
    mode's local references: exact), τ taken in `tau`'s space."""

    solver: Solver
    ground_cost: GroundCost
    projection: str  # how the noise's projections are drawn: as each pair's R
    noise_splits: int | str  # a number of halvings, or "auto" (`noise_draws`)
    tau: TauSpace
    sinkhorn_reg: float = 0.1

    @property
    def per_pair_tau(self) -> bool:
        return self.tau.per_pair

    @property
    def modules(self) -> tuple[str, ...]:
        """The assignment solvers and POT's simplex (for the pairs of silos of unequal sizes)
        for exact W1, POT for Sinkhorn."""
        return {"sinkhorn": ("cfl_mpi.ot.pot",)}.get(self.solver, ("cfl_mpi.ot.solvers",))

    @property
    def silo_modules(self) -> tuple[str, ...]:
        """LAPJV alone for exact W1 (τ and the noise are assignment problems: `tau_between`,
        `reference`), POT for Sinkhorn."""
        return self.modules if self.solver == "sinkhorn" else ("lap",)

    def tau_between(self, z_own: np.ndarray, z_val: np.ndarray) -> float:
        """τ's W1 (Alg. 1, line 14) between the silo's training and validation clouds. For the
        exact solver the larger cloud is first cut to a size whose W1 against the other is an
        assignment problem (`assignment_sizes`: a multiple of the smaller), solved by LAPJV: τ
        at equal sizes is the paper's to the bit, and a silo needs neither POT's network simplex
        nor scipy.optimize, whose imports cost every silo rank about a second before round 1
        (docs/research/PERFORMANCE.md, "Lean silo ranks"). The cut keeps evenly spaced rows: both clouds
        are in the order of the data set's pool, which may follow its sources (MNIST's test
        split does), so a systematic sample, not the first rows."""
        if self.solver == "sinkhorn":
            return pair_distance(self, z_own, z_val)
        n, m = assignment_sizes(len(z_own), len(z_val))
        return w1_repeated(ground_cost(evenly_spaced(z_own, n), evenly_spaced(z_val, m), self.ground_cost))

    def between(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> np.ndarray:
        """Each pair's W1, the ground-cost matrices of equal shapes computed stacked."""
        out = np.empty(len(xs))
        for ks, x, y in stacked(xs, ys):
            for k, cost in zip(ks, ground_costs(x, y, self.ground_cost)):
                out[k] = transport_cost(cost, self.solver, self.sinkhorn_reg)
        return out

    def reference(
        self, z_own: np.ndarray, z_val: np.ndarray, dim_r: int, rng: np.random.Generator
    ) -> tuple[float | None, float]:
        """τ_c = W1(Z_{c|c}, Z^val_{c|c}) (Alg. 1, line 14) in `tau`'s space, and the silo's noise.

        The noise is how far W[c][c'] strays from 0 when c' holds c's own distribution. W is a
        projected W1 minus τ (line 16), so the silo simulates exactly that with its own data:
        over random halvings V1, V2 of its validation embeddings and fresh random projections
        R_k, the RMS of W1(Z' R_k, V1 R_k) − W1(Z', V2) (W1(Z' R_k, V2 R_k) with τ per pair), Z'
        a random subset of 2h of its n training embeddings, h = |V1| = |V2| = min(⌊|V|/2⌋, ⌊n/2⌋).
        Both sampling noise and the distortion of the projection are in it; the robust cluster
        extraction measures W in these units. |Z'| = 2|V1| makes each W1 an assignment problem
        (w1_repeated; docs/research/FIDELITY.md, row "noise scale"); where that drops points (n odd, or
        ⌊|V|/2⌋ > ⌊n/2⌋) the fluctuation of an empirical W1, which goes like (1/|Z'| + 1/h)^(1/2),
        is rescaled to the full sizes (n, ⌊|V|/2⌋). The halves hold half the samples of the real
        comparison, and that fluctuation shrinks like n^(-1/2), so the RMS is scaled by 1/√2 to
        the full size."""
        n, halves = len(z_own), len(z_val) // 2
        h = min(halves, n // 2)
        null = []
        for _ in range(noise_draws(self.noise_splits, h) if h >= 1 else 0):
            order = rng.permutation(len(z_val))
            sub = np.sort(rng.permutation(n)[: 2 * h])
            r = random_projection(rng, z_own.shape[1], dim_r, self.projection)
            projected_own = z_own[sub] @ r
            first, second = z_val[order[:h]], z_val[order[h : 2 * h]]
            reference = self.tau.in_noise(self, z_own[sub], second, r)
            null.append(pair_distance(self, projected_own, first @ r) - reference)
        noise = 0.0
        if null:
            to_full_sizes = (1.0 / n + 1.0 / halves) / (1.0 / (2 * h) + 1.0 / h)
            noise = float(np.sqrt(np.mean(np.square(null)) * to_full_sizes / 2.0))
        return self.tau.of_silo(self, z_own, z_val, rng, self.projection), noise

    def pair_reference(self, zr_own: np.ndarray, z_val: np.ndarray, r: np.ndarray) -> float:
        """τ_{c,c'} = W1(Z_{c|c} R, Z^val_{c|c} R): line 14's reference through the pair's own R,
        so that line 16 subtracts it in the space where W1(Z_{c|c} R, Z_{c'|c} R) was measured
        and the projection's distortion of the two cancels: on small silos it is most of W's
        spread (docs/research/SMALL_SILOS.md)."""
        return self.tau_between(zr_own, z_val @ r)


@dataclass(frozen=True)
class Energy:
    """The energy distance instead of W1: the debiased limit of the Sinkhorn divergence,
    dimension-free in its sample size (ot/energy.py, docs/research/SMALL_SILOS.md); numpy alone. Its
    estimate is unbiased, so τ is 0 (config validation refuses τ per pair)."""

    ground_cost: GroundCost
    projection: str
    noise_splits: int | str

    @property
    def per_pair_tau(self) -> bool:
        return False

    @property
    def modules(self) -> tuple[str, ...]:
        return ()

    @property
    def silo_modules(self) -> tuple[str, ...]:
        return ()

    def between(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> np.ndarray:
        out = np.empty(len(xs))
        for ks, x, y in stacked(xs, ys):
            out[ks] = energy_distances(x, y, self.ground_cost)
        return out

    def reference(
        self, z_own: np.ndarray, z_val: np.ndarray, dim_r: int, rng: np.random.Generator
    ) -> tuple[float | None, float]:
        """τ = 0, and the noise: the energy distance's U-statistic is 0 on average between two
        samples of one distribution (ot/energy.py); its spread there is the permutation null
        (Székely & Rizzo 2013, §5): over random halvings A, B of the n training embeddings and
        fresh projections R_k, the RMS of E(Z_A R_k, Z_B R_k). That statistic is degenerate under
        the null, its spread ∝ 1/|A| + 1/|B|, so the RMS is scaled by (2/n) / (1/|A| + 1/|B|) to
        W's sizes (n against n)."""
        n, h = len(z_own), len(z_own) // 2
        if h < 2:
            return 0.0, 0.0
        firsts, seconds = [], []
        for _ in range(noise_draws(self.noise_splits, h)):
            order = rng.permutation(n)
            r = random_projection(rng, z_own.shape[1], dim_r, self.projection)
            firsts.append(z_own[order[:h]] @ r)
            seconds.append(z_own[order[h : 2 * h]] @ r)
        null = energy_distances(np.stack(firsts), np.stack(seconds), self.ground_cost)
        return 0.0, float(np.sqrt(np.mean(np.square(null))) * (2.0 / n) / (2.0 / h))

    def pair_reference(self, zr_own: np.ndarray, z_val: np.ndarray, r: np.ndarray) -> float:
        raise AssertionError("the energy distance has no τ (config validation refuses tau_projection: pair)")
