"""Running time and accuracy of FedWaD against exact OT: the shape of the paper's Figure 2.

Rakotomamonjy et al., Federated Wasserstein Distance, ICLR 2024, Figure 2 (left panels) and
Appendix D.1: two 2-D Gaussians with the same covariance and different means, μ with N
samples and ν with N/3 (sample ratio 1:3); for growing N, the running time and the relative
error |estimate - W| / W of

* WD        : the exact, non-federated W2 between the samples (POT ``ot.emd2``),
* FedWaD-e  : FedWaD with the exact interpolating measure (Eq. 5), ξ(0) of 10 points,
* FedWaD-a-S: FedWaD with the approximate interpolation (Eq. 10), support S ∈ {2, 10, 100},

W being the closed form W2 = ||m_μ - m_ν|| (common covariance). FedWaD is simulated in one
process (no communication): its time is the time of its 3K + 2 OT problems.

    python benchmarks/fedwad.py [--out DIR] [--quick]

writes ``results.csv``, ``table.md`` and ``fedwad_fig2.png`` into DIR (default
./runs/bench_fedwad) and prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ot  # noqa: E402

from cfl_mpi.ot.fedwad import fedwad  # noqa: E402

MEAN_SHIFT = np.array([3.0, 4.0])  # m_ν - m_μ: the true W2 is 5
SUPPORTS = (2, 10, 100)
EXACT_INIT_SUPPORT = 10


@dataclass(frozen=True)
class Row:
    n: int
    m: int
    method: str
    support: int  # S (size of ξ(0)); 0 for WD
    iters: int
    runs: int
    time_mean: float  # wall clock, s
    time_std: float
    cpu_mean: float  # process CPU time, s (robust to other jobs on the machine)
    estimate: float
    rel_err: float  # against the closed form W2 = ||m_μ - m_ν||
    rel_err_emp: float  # against the exact W2 of the same samples (nan when not computed)
    final_support: int


def _samples(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    m = max(n // 3, 1)
    return rng.normal(size=(n, 2)), rng.normal(size=(m, 2)) + MEAN_SHIFT


def _exact_w2(x: np.ndarray, y: np.ndarray) -> float:
    a, b = np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y))
    cost = ot.dist(x, y)
    return float(np.sqrt(ot.emd2(a, b, cost / cost.max(), numItermax=50_000_000) * cost.max()))


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run(sizes, iters: int, repeats: int, seed: int, max_exact_fedwad_n: int, max_wd_n: int):
    w_true = float(np.linalg.norm(MEAN_SHIFT))
    rows, notes = [], []
    methods = [("WD", 0), ("FedWaD-e", EXACT_INIT_SUPPORT)] + [("FedWaD-a", s) for s in SUPPORTS]
    for n in sizes:
        reps = repeats if n < 10_000 else 1
        if reps < repeats:
            notes.append(f"N = {n}: {reps} run instead of {repeats} (time)")
        samples = [_samples(n, seed + r) for r in range(reps)]
        emp = [np.nan] * reps
        for name, support in methods:
            if name == "WD" and n > max_wd_n:
                notes.append(f"N = {n}: exact WD skipped (cap --max-wd-n {max_wd_n})")
                continue
            if name == "FedWaD-e" and n > max_exact_fedwad_n:
                last = next((r for r in reversed(rows) if r.method == "FedWaD-e"), None)
                seen = (
                    f"; at N = {last.n} it took {last.cpu_mean:.2g} s CPU and ξ(K) had {last.final_support} atoms"
                    if last
                    else ""
                )
                notes.append(
                    f"N = {n}: FedWaD-e skipped (cap --max-exact-fedwad-n {max_exact_fedwad_n})"
                    f"{seen}: its 3K + 2 plans are N x |ξ| with |ξ| ≥ N/3 and growing past N, "
                    f"dense float64 matrices of ≥ {8 * n * (n // 3) / 1e6:.3g} MB each, and the "
                    f"network simplex grows faster than quadratically in N "
                    f"(extrapolated: hours of CPU)"
                )
                continue
            times, cpus, ests, finals = [], [], [], []
            for r, (x, y) in enumerate(samples):
                if name == "WD":
                    est, dt, dc = _timed(partial(_exact_w2, x, y))
                    emp[r], final = est, 0
                else:
                    method = "exact" if name == "FedWaD-e" else "approx"
                    res, dt, dc = _timed(
                        partial(
                            fedwad, x, y, p=2, n_iter=iters, t=0.5, method=method, support_size=support, seed=seed + r
                        )
                    )
                    est, final = res.distance, int(res.support_sizes[-1])
                times.append(dt)
                cpus.append(dc)
                ests.append(est)
                finals.append(final)
            ests_a = np.array(ests)
            rows.append(
                Row(
                    n=n,
                    m=max(n // 3, 1),
                    method=name if name != "FedWaD-a" else f"FedWaD-a-{support}",
                    support=support,
                    iters=0 if name == "WD" else iters,
                    runs=len(times),
                    time_mean=float(np.mean(times)),
                    time_std=float(np.std(times)),
                    cpu_mean=float(np.mean(cpus)),
                    estimate=float(np.mean(ests_a)),
                    rel_err=float(np.mean(np.abs(ests_a - w_true) / w_true)),
                    rel_err_emp=float(np.mean(np.abs(ests_a - np.array(emp)) / np.array(emp))),
                    final_support=int(np.max(finals)),
                )
            )
            print(
                f"  N={n:>5} {rows[-1].method:<13} {rows[-1].time_mean:9.3f} s wall {rows[-1].cpu_mean:9.3f} s CPU",
                file=sys.stderr,
                flush=True,
            )
    return rows, notes


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if not np.isfinite(v) else f"{v:.{digits}g}"


def markdown(rows: list[Row], notes: list[str], w_true: float) -> str:
    lines = [
        f"True W2 = ||m_μ - m_ν|| = {w_true:g}; μ: N samples, ν: N/3 samples, 2-D, Σ = I.",
        "",
        "| N | N/3 | method | S | K | runs | wall time (s) | CPU time (s) | estimate "
        "| rel. err vs true W2 | rel. err vs exact WD | final support |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.n} | {r.m} | {r.method} | {r.support or '—'} | {r.iters or '—'} | {r.runs} "
            f"| {r.time_mean:.3g} ± {r.time_std:.2g} | {r.cpu_mean:.3g} | {r.estimate:.4f} "
            f"| {_fmt(r.rel_err)} "
            f"| {_fmt(r.rel_err_emp)} | {r.final_support or '—'} |"
        )
    lines += ["", "Speed ratio time(FedWaD-e) / time(FedWaD-a-S), same run, CPU time (wall time in brackets):", ""]
    lines += ["| N | " + " | ".join(f"S = {s}" for s in SUPPORTS) + " |", "|---:|" + "---:|" * len(SUPPORTS)]
    by = {(r.n, r.method): r for r in rows}
    for n in sorted({r.n for r in rows}):
        exact = by.get((n, "FedWaD-e"))
        cells = []
        for s in SUPPORTS:
            approx = by.get((n, f"FedWaD-a-{s}"))
            if exact is None or approx is None:
                cells.append("— (FedWaD-e not run)")
                continue
            cells.append(
                f"{exact.cpu_mean / max(approx.cpu_mean, 1e-9):.1f}x ({exact.time_mean / approx.time_mean:.1f}x)"
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Notes:"] + [f"- {note}" for note in notes]
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in dict.fromkeys(r.method for r in rows):
        sel = [r for r in rows if r.method == method]
        ns = [r.n for r in sel]
        ax_t.plot(ns, [r.cpu_mean for r in sel], marker="o", label=method)
        ax_e.plot(ns, [max(r.rel_err, 1e-16) for r in sel], marker="o", label=method)
    for ax, label in ((ax_t, "CPU time (s)"), (ax_e, "relative error vs true W2")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of samples N (second measure: N/3)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend()
    fig.suptitle("FedWaD vs exact W2, 2-D Gaussians, sample ratio 1:3 (cf. paper Fig. 2)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_fedwad"))
    ap.add_argument("--quick", action="store_true", help="K = 10 and one run per N instead of K = 20 and three")
    ap.add_argument("--iters", type=int, default=None, help="K (default 20, paper D.1; quick 10)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per N (default 3; quick 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-exact-fedwad-n", type=int, default=1000)
    ap.add_argument("--max-wd-n", type=int, default=10_000)
    args = ap.parse_args(argv)

    sizes = (10, 100, 1000, 10_000)
    iters = args.iters or (10 if args.quick else 20)
    repeats = args.repeats or (1 if args.quick else 3)
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows, notes = run(sizes, iters, repeats, args.seed, args.max_exact_fedwad_n, args.max_wd_n)
    notes.append(
        f"total benchmark time {time.perf_counter() - started:.0f} s wall on "
        f"{os.cpu_count()} CPU(s); load average {load:.1f} at the start (wall times "
        f"include waiting for other jobs, CPU times do not)"
    )
    table = markdown(rows, notes, float(np.linalg.norm(MEAN_SHIFT)))
    print(table)

    with open(args.out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    (args.out / "table.md").write_text(table + "\n")
    plot(rows, args.out / "fedwad_fig2.png")
    print(f"\nwrote {args.out / 'results.csv'}, {args.out / 'table.md'}, {args.out / 'fedwad_fig2.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
