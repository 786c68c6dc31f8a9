"""Exact W1 between uniform clouds: each exact solver side by side, and the server's W1 phase.

    python -m benchmarks.w1 [--dims 115] [--repeats 5] [--quick]

EMD-CFL solves two W1 per pair of silos on the server (C(C−1) solves), so the exact solver
is on the hot path. With n = m uniform points an assignment solver gives the same value as
POT's network simplex (Birkhoff). Prints, at n ∈ {128, 512, 2048}, each solver's CPU time
(scipy `linear_sum_assignment`, LAPJV from `lapx`, POT `emd2`) as a ratio to
scipy's, interleaved so that all see the same machine load; then the throughput of a pool of
threads against one (the solvers release the GIL); the noise estimate's n × n/2 problems
(POT against the assignment of the repeated cost matrix, scipy and LAPJV); and the server's W1 phase at 40 silos,
n = 512 projected for a 16-core node from it.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import lap
import numpy as np
from scipy.optimize import linear_sum_assignment

from cfl_mpi.ot.wasserstein import ground_cost, w1_assignment, w1_emd, w1_repeated


def w1_lapjv(cost: np.ndarray) -> float:
    """LAPJV (lapx) on the square cost matrix."""
    _, cols, _ = lap.lapjv(cost)
    return float(cost[np.arange(len(cost)), cols].mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=115)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 repeats, n = 2048 once")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    solvers = {"scipy": w1_assignment, "lapjv (lapx)": w1_lapjv, "POT emd2": w1_emd}
    rng = np.random.default_rng(0)
    print(
        "| n | scipy CPU ms | "
        + " | ".join(f"{k} / scipy" for k in solvers if k != "scipy")
        + " | max \\|difference\\| |"
    )
    print("|---" * (len(solvers) + 2) + "|")
    per_solve = {}
    for n in (128, 512, 2048):
        times = {k: [] for k in solvers}
        values = {}
        for _ in range(1 if n == 2048 and args.quick else repeats):
            x, y = rng.normal(size=(n, args.dims)), rng.normal(size=(n, args.dims)) + 0.05
            cost = ground_cost(x, y, "cosine")
            for name, solve in solvers.items():
                start = time.thread_time()  # CPU seconds: the shared machine's load does not count
                values[name] = solve(cost)
                times[name].append(time.thread_time() - start)
        best = {k: float(np.median(v)) for k, v in times.items()}
        per_solve[n] = best["scipy"]
        spread = max(abs(v - values["scipy"]) for v in values.values())
        print(
            f"| {n} | {1e3 * best['scipy']:.2f} | "
            + " | ".join(f"{best[k] / best['scipy']:.2f}" for k in solvers if k != "scipy")
            + f" | {spread:.1e} |",
            flush=True,
        )

    # The noise estimate's problems: n points against n/2 (each of those repeated twice).
    def scipy_repeated(cost: np.ndarray) -> float:
        return w1_assignment(np.repeat(cost, cost.shape[0] // cost.shape[1], axis=1))

    repeated = {"POT emd2": w1_emd, "scipy on repeated": scipy_repeated, "LAPJV on repeated (ours)": w1_repeated}
    print(
        "\n| n × n/2 | POT emd2 CPU ms | "
        + " | ".join(f"{k} / emd2" for k in list(repeated)[1:])
        + " | max \\|difference\\| |"
    )
    print("|---" * (len(repeated) + 2) + "|")
    for n in (128, 288, 512):
        times = {k: [] for k in repeated}
        for _ in range(repeats):
            cost = ground_cost(
                np.abs(rng.normal(size=(n, args.dims))), np.abs(rng.normal(size=(n // 2, args.dims))), "cosine"
            )
            values = {}
            for name, solve in repeated.items():
                start = time.thread_time()
                values[name] = solve(cost)
                times[name].append(time.thread_time() - start)
        best = {k: float(np.median(v)) for k, v in times.items()}
        spread = max(abs(v - values["POT emd2"]) for v in values.values())
        print(
            f"| {n} × {n // 2} | {1e3 * best['POT emd2']:.2f} | "
            + " | ".join(f"{best[k] / best['POT emd2']:.2f}" for k in list(repeated)[1:])
            + f" | {spread:.1e} |"
        )

    costs = [
        ground_cost(rng.normal(size=(512, args.dims)), rng.normal(size=(512, args.dims)), "cosine")
        for _ in range(8 if args.quick else 16)
    ]
    walls = {}
    for threads in (1, 2):
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(linear_sum_assignment, costs))
        walls[threads] = time.perf_counter() - start
    efficiency = walls[1] / walls[2] / 2
    solves = 40 * 39
    print(
        f"\nscipy at n = 512 on a pool: 2 threads give {walls[1] / walls[2]:.2f}× one thread "
        f"(parallel efficiency {100 * efficiency:.0f} %, on a machine shared with other jobs)."
    )
    print(
        f"Server W1 phase at 40 silos, n = 512 ({solves} solves of {1e3 * per_solve[512]:.1f} ms here): "
        f"{solves * per_solve[512]:.1f} s on one core; projected on 16 cores at 100 % efficiency "
        f"{solves * per_solve[512] / 16:.2f} s, at the efficiency measured here "
        f"{solves * per_solve[512] / (16 * max(efficiency, 1 / 16)):.2f} s."
    )


if __name__ == "__main__":
    main()
