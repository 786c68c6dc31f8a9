"""EMD-CFL's pair distance: what an entry of W is made of (Alg. 1, line 16), the silo's
reference τ and noise unit it is measured in, and the solvers a party needs for them.

`pair_distance` takes one pair of projected clouds, `pair_distances` a batch: the server
measures every pair of a message in one call, its cost matrices (or energy distances) as
stacked array arithmetic, each entry the bits of `pair_distance` on its own
(tests/strategies/test_emdcfl_distances.py).
"""

from __future__ import annotations

import math

import numpy as np

from ...ot.energy import energy_distances
from ...ot.wasserstein import ground_costs, transport_cost
from ...privacy.handshake import random_projection
from . import EmdCflConfig

# Pairs stacked into one array computation at most: a few dozen ~100-point clouds keep the
# stacked distance matrices in the CPU's caches, where hundreds spill out of them and take
# longer per pair than one pair at a time (docs/PERFORMANCE.md, "Stacked pair distances").
STACK = 32


def projected_dim(s: EmdCflConfig, embedding_dim: int) -> int:
    """dim(R) = ⌊proj_ratio · dim(Z)⌋ (proj_ratio 0.9 in the paper and the authors' code)."""
    return int(s.proj_ratio * embedding_dim)


def sample_size(s: EmdCflConfig, n_train: int) -> int:
    """n = min(10 % of the silo's training data, 512) (the paper's §3, complexity paragraph)."""
    return max(2, min(math.ceil(s.sample_fraction * n_train), s.max_rows, n_train))


def reference_distance(
    z_own: np.ndarray, z_val: np.ndarray, dim_r: int, s: EmdCflConfig, rng: np.random.Generator
) -> tuple[float | None, float]:
    """τ_c = W1(Z_{c|c}, Z^val_{c|c}) (Alg. 1, line 14) and the silo's noise scale. With
    `tau_projection: full` τ_c is taken through a fresh dim(Z) × dim(Z) random projection, drawn
    after the noise's, as the authors' code does; with `pair` it is taken per pair, through the
    pair's R (`pair_reference`), and None here.

    The noise is how far W[c][c'] strays from 0 when c' holds c's own distribution. W is a
    projected W1 minus τ (line 16), so the silo simulates exactly that with its own data:
    over random halvings V1, V2 of its validation embeddings and fresh random projections
    R_k, the RMS of W1(Z' R_k, V1 R_k) − W1(Z', V2) (W1(Z' R_k, V2 R_k) with `pair`), Z' a
    random subset of 2h of its n training embeddings, h = |V1| = |V2| = min(⌊|V|/2⌋, ⌊n/2⌋).
    Both sampling noise and the distortion of the projection are in it; the robust cluster
    extraction measures W in these units. |Z'| = 2|V1| makes each W1 an assignment problem
    (w1_repeated; docs/FIDELITY.md, row "noise scale"); where that drops points (n odd, or ⌊|V|/2⌋ > ⌊n/2⌋) the
    fluctuation of an empirical W1, which goes like (1/|Z'| + 1/h)^(1/2), is rescaled to the
    full sizes (n, ⌊|V|/2⌋). The halves hold half the samples of the real comparison, and
    that fluctuation shrinks like n^(-1/2), so the RMS is scaled by 1/√2 to the full size.
    With `distance: energy` τ is 0 and the noise is `energy_noise`'s.
    """
    if s.distance == "energy":
        return 0.0, energy_noise(z_own, dim_r, s, rng)
    per_pair = s.tau_projection == "pair"
    n, halves = len(z_own), len(z_val) // 2
    h = min(halves, n // 2)
    null = []
    for _ in range(s.noise_splits if h >= 1 else 0):
        order = rng.permutation(len(z_val))
        sub = np.sort(rng.permutation(n)[: 2 * h])
        r = random_projection(rng, z_own.shape[1], dim_r, s.projection)
        projected_own = z_own[sub] @ r
        first, second = z_val[order[:h]], z_val[order[h : 2 * h]]
        reference = pair_distance(projected_own, second @ r, s) if per_pair else pair_distance(z_own[sub], second, s)
        null.append(pair_distance(projected_own, first @ r, s) - reference)
    noise = 0.0
    if null:
        to_full_sizes = (1.0 / n + 1.0 / halves) / (1.0 / (2 * h) + 1.0 / h)
        noise = float(np.sqrt(np.mean(np.square(null)) * to_full_sizes / 2.0))
    if per_pair:
        return None, noise
    if s.tau_projection == "full":
        r = random_projection(rng, z_own.shape[1], z_own.shape[1], s.projection)
        return pair_distance(z_own @ r, z_val @ r, s), noise
    return pair_distance(z_own, z_val, s), noise


def energy_noise(z_own: np.ndarray, dim_r: int, s: EmdCflConfig, rng: np.random.Generator) -> float:
    """The noise of W with `distance: energy`, which needs no τ: the energy distance's U-statistic
    is unbiased, 0 on average between two samples of one distribution (ot/energy.py). Its spread
    there is the permutation null (Székely & Rizzo 2013, §5): over random halvings A, B of the
    n training embeddings and fresh projections R_k, the RMS of E(Z_A R_k, Z_B R_k). That
    statistic is degenerate under the null, its spread ∝ 1/|A| + 1/|B|, so the RMS is scaled by
    (2/n) / (1/|A| + 1/|B|) to W's sizes (n against n)."""
    n, h = len(z_own), len(z_own) // 2
    if h < 2:
        return 0.0
    firsts, seconds = [], []
    for _ in range(s.noise_splits):
        order = rng.permutation(n)
        r = random_projection(rng, z_own.shape[1], dim_r, s.projection)
        firsts.append(z_own[order[:h]] @ r)
        seconds.append(z_own[order[h : 2 * h]] @ r)
    null = energy_distances(np.stack(firsts), np.stack(seconds), s.ground_cost)
    return float(np.sqrt(np.mean(np.square(null))) * (2.0 / n) / (2.0 / h))


def pair_distance(x: np.ndarray, y: np.ndarray, s: EmdCflConfig) -> float:
    """The distance between two clouds that W is made of (line 16, before τ): W1 by the exact
    or Sinkhorn solver (FedWaD mode's local references: exact), or with `distance: energy`
    the energy distance, W1's debiased limit (ot/energy.py, docs/SMALL_SILOS.md)."""
    return float(pair_distances([x], [y], s)[0])


def solver_modules(s: EmdCflConfig) -> tuple[str, ...]:
    """What `pair_distance` and FedWaD's plans call into: the assignment solvers and POT's
    simplex (for clouds of unequal sizes, as τ's training and validation samples mostly are)
    for exact W1 and FedWaD, POT for Sinkhorn; the energy distance is numpy alone."""
    return {"energy": (), "sinkhorn": ("cfl_mpi.ot.pot",)}.get(s.distance, ("cfl_mpi.ot.solvers",))


def pair_distances(xs: list[np.ndarray], ys: list[np.ndarray], s: EmdCflConfig) -> np.ndarray:
    """`pair_distance` of each pair (xs[k], ys[k]), pairs of equal shapes stacked (at most
    STACK) into one array computation: the energy distances, or the ground-cost matrices
    before their solves."""
    out = np.empty(len(xs))
    shapes: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for k, (x, y) in enumerate(zip(xs, ys)):
        shapes.setdefault((x.shape, y.shape), []).append(k)
    chunks = [same[i : i + STACK] for same in shapes.values() for i in range(0, len(same), STACK)]
    for ks in chunks:
        x, y = np.stack([xs[k] for k in ks]), np.stack([ys[k] for k in ks])
        if s.distance == "energy":
            out[ks] = energy_distances(x, y, s.ground_cost)
            continue
        solver = "exact" if s.distance == "fedwad" else s.distance
        for k, cost in zip(ks, ground_costs(x, y, s.ground_cost)):
            out[k] = transport_cost(cost, solver, s.sinkhorn_reg)
    return out


def pair_reference(zr_own: np.ndarray, z_val: np.ndarray, r: np.ndarray, s: EmdCflConfig) -> float:
    """τ_{c,c'} = W1(Z_{c|c} R, Z^val_{c|c} R): line 14's reference through the pair's own R
    (`tau_projection: pair`), so that line 16 subtracts it in the space where W1(Z_{c|c} R,
    Z_{c'|c} R) was measured and the projection's distortion of the two cancels: on small
    silos it is most of W's spread (docs/SMALL_SILOS.md). (With `distance: energy` there is
    no τ: config validation refuses `pair`.)"""
    return pair_distance(zr_own, z_val @ r, s)
