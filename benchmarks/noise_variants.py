"""Cheaper designs of a silo's noise estimate, side by side with the current one.

    python -m benchmarks.noise_variants BEFORE_TREE [--seeds 30] [--quick]

The current estimator (`Transport.reference`, its noise part) spends ~70 % of its CPU in 60
exact LAPJV solves (two per draw, 30 draws), and the 30 draws of W1(Z'R, V1R) − W1(Z', V2)
are close to Gaussian with mean ≈ 0, so the RMS has the spread of a χ with 30 degrees of
freedom (1/√60 ≈ ±13 %) whatever is done to the draws. Each variant below keeps every W1 an exact
optimal-transport value and changes only which draws are taken. On the same silos as
`noise_estimate` (digits and MNIST-test-split silos after one round of local training),
all estimators run interleaved over the same generator seeds; prints, per variant, its CPU
(thread time) against the current estimator's and the 703ab81 one's measured side by side,
the mean of its value against the current one's, and its spread over seeds (std / mean).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import lap
import numpy as np
import torch
from threadpoolctl import threadpool_limits

from benchmarks.noise_estimate import CASES, MNIST, silo_embeddings
from cfl_mpi.ot.wasserstein import ground_cost, transport_cost
from cfl_mpi.privacy.handshake import random_projection

PROJECTION = "gaussian"  # the R these variants were measured with


def _sizes(z: np.ndarray, v: np.ndarray) -> tuple[int, int, int]:
    n, halves = len(z), len(v) // 2
    return n, halves, min(halves, n // 2)


def _rms(null: list[float], n: int, halves: int, h: int) -> float:
    """The current estimator's rescaling to the full sizes and by 1/√2."""
    return float(np.sqrt(np.mean(np.square(null)) * (1.0 / n + 1.0 / halves) / (1.0 / (2 * h) + 1.0 / h) / 2.0))


def current(z, v, dim_r, rng, draws=30, frac=1.0):
    """The noise part of `Transport.reference` (draws = 30, frac = 1): fewer draws, or Z' and
    the halves subsampled to frac · h and rescaled to the full sizes, with the other values."""
    full = ground_cost(z, v)
    n, halves, h = _sizes(z, v)
    h = int(round(frac * h))
    null = []
    for _ in range(draws):
        order = rng.permutation(len(v))
        sub = np.sort(rng.permutation(n)[: 2 * h])
        r = random_projection(rng, z.shape[1], dim_r, PROJECTION)
        null.append(
            transport_cost(ground_cost(z[sub] @ r, v[order[:h]] @ r))
            - transport_cost(full[np.ix_(sub, order[h : 2 * h])])
        )
    return _rms(null, n, halves, h)


def lean(z, v, dim_r, rng):
    """The current draws, fewer copies: the unprojected 2-fold repeated matrix gathered in
    one step (no np.ix_ then np.repeat), LAPJV's own total (no gather). Same value to ~1e-15."""
    full = ground_cost(z, v)
    n, halves, h = _sizes(z, v)
    null = []
    for _ in range(30):
        order = rng.permutation(len(v))
        sub = np.sort(rng.permutation(n)[: 2 * h])
        r = random_projection(rng, z.shape[1], dim_r, PROJECTION)
        a = lap.lapjv(np.repeat(ground_cost(z[sub] @ r, v[order[:h]] @ r), 2, axis=1))[0]
        b = lap.lapjv(full.take(sub, axis=0).take(np.repeat(order[h : 2 * h], 2), axis=1))[0]
        null.append((a - b) / (2 * h))
    return _rms(null, n, halves, h)


def shared(z, v, dim_r, rng, splits=15, projections=2):
    """`projections` fresh R per halving, all against one W1(Z', V2): fewer solves per draw,
    but the draws of a halving are correlated (+0.4 to +0.7)."""
    full = ground_cost(z, v)
    n, halves, h = _sizes(z, v)
    null = []
    for _ in range(splits):
        order = rng.permutation(len(v))
        sub = np.sort(rng.permutation(n)[: 2 * h])
        b = transport_cost(full[np.ix_(sub, order[h : 2 * h])])
        for _ in range(projections):
            r = random_projection(rng, z.shape[1], dim_r, PROJECTION)
            null.append(transport_cost(ground_cost(z[sub] @ r, v[order[:h]] @ r)) - b)
    return _rms(null, n, halves, h)


def before_703ab81(tree: Path):
    """The noise part of 703ab81's estimator with its own solvers: Z all n points, halves ⌊|V|/2⌋."""
    spec = importlib.util.spec_from_file_location("before_noise_w1", tree / "cfl_mpi" / "ot" / "wasserstein.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def noise(z, v, dim_r, rng):
        half, null = len(v) // 2, []
        for _ in range(30):
            order = rng.permutation(len(v))
            r = random_projection(rng, z.shape[1], dim_r, PROJECTION)
            null.append(module.w1(z @ r, v[order[:half]] @ r) - module.w1(z, v[order[half : 2 * half]]))
        return float(np.sqrt(np.mean(np.square(null)) / 2.0))

    return noise


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="2 silos per data set, 5 seeds")
    args = parser.parse_args(argv)
    seeds = 5 if args.quick else args.seeds
    torch.set_num_threads(1)
    threadpool_limits(1)
    variants = {
        "current": current,
        "before_703ab81": before_703ab81(args.before),
        "lean_same_draws": lean,
        "shared_B_15x2": shared,
        "shared_B_20x2": lambda *a: shared(*a, splits=20),
        "draws_20": lambda *a: current(*a, draws=20),
        "draws_15": lambda *a: current(*a, draws=15),
        "subsample_0.7h": lambda *a: current(*a, frac=0.7),
    }
    values: dict[str, list[list[float]]] = {k: [] for k in variants}
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    for name, (config, overrides) in CASES.items():
        if name == "mnist_test" and not MNIST.is_dir():
            continue
        for silo in (0, 4) if args.quick else (0, 2, 4, 6):
            z, v, dim_r, _ = silo_embeddings(config, overrides, silo)
            vals, secs = {k: [] for k in variants}, {k: 0.0 for k in variants}
            for seed in range(seeds):  # interleaved, so all see the same machine load
                for label, fn in variants.items():
                    start = time.thread_time()
                    vals[label].append(fn(z, v, dim_r, np.random.default_rng(seed)))
                    secs[label] += time.thread_time() - start
            print(
                f"{name} silo {silo} (n = {len(z)}, |V| = {len(v)}): CPU ms per call "
                + ", ".join(f"{k} {1e3 * t / seeds:.0f}" for k, t in secs.items()),
                flush=True,
            )
            for k in variants:
                values[k].append(vals[k])
                seconds[k].append(secs[k])
    cur = [np.mean(x) for x in values["current"]]
    print(
        "\n| variant | CPU current / variant | CPU 703ab81 / variant | mean vs current (mean over silos; "
        "min..max) | spread over seeds (mean over silos; min..max) |"
    )
    print("|---|---|---|---|---|")
    for k in variants:
        rc = np.array(seconds["current"]) / np.array(seconds[k])
        rb = np.array(seconds["before_703ab81"]) / np.array(seconds[k])
        mr = np.array([np.mean(x) for x in values[k]]) / cur
        sp = np.array([np.std(x) / np.mean(x) for x in values[k]])
        print(
            f"| {k} | {rc.mean():.2f} ({rc.min():.2f}–{rc.max():.2f}) | {rb.mean():.2f} "
            f"| {mr.mean():.3f} ({mr.min():.3f}..{mr.max():.3f}) "
            f"| ±{100 * sp.mean():.1f} % ({100 * sp.min():.0f}–{100 * sp.max():.0f}) |"
        )


if __name__ == "__main__":
    main()
