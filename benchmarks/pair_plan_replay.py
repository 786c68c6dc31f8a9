"""The staged pair plan replayed on recorded all-pairs W (strategies/emdcfl/staged_pairs.py).

    python -m benchmarks.pair_plan_replay [RUN_DIR ...] [--seeds 100] [--scale 2400]
                                          [--settings 40/2 ...] [--ways both|one|compare]

Each recorded matrix (benchmarks/data/recorded_w.npz, or the W.npy, noise.npy and
clusters.json of the given run folders) is clustered twice: by the robust rule on all pairs,
as the run did, and by the staged plan, which looks up only the pairs it asks for, over
`--seeds` draws of its sample, its placing stages measured both ways, one way
(`strategy.placement`), or each (`--ways compare`). Printed per plan setting: ARI against the truth and against
the all-pairs partition (mean and min over seeds), the pairs and the directions (W entries)
it measured (share of all) and the margin over those pairs (closest pair across clusters over the loosest inside one,
noise units; the robust rule's report).

`--scale C` also replays on a synthetic C-silo federation built from each recorded matrix:
silo i copies a recorded silo s(i) of the same true cluster, W[i][j] = W_rec[s(i)][s(j)],
and two copies of one recorded silo take the recorded W of s(i) to another member of its
cluster. Marked "synthetic": it tests the plan's pair count and its decisions on the
recorded distribution of entries, not a live run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

from cfl_mpi.clustering.extraction import extract_clusters, partition_report
from cfl_mpi.strategies.emdcfl.staged_pairs import StagedPlan

RECORDED = Path(__file__).parent / "data" / "recorded_w.npz"
SETTINGS = ((10, 1), (20, 1), (20, 2), (40, 1), (40, 2))  # (pair_sample, representatives)
CUT = 3.5
RETEST = 4  # strategy.retest's default


def recorded(runs: list[Path]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """name → (W, noise, truth): the committed matrices, or the run folders given."""
    if not runs:
        data = np.load(RECORDED)
        names = sorted({k.rsplit("/", 1)[0] for k in data.files})
        return {n: (data[f"{n}/W"], data[f"{n}/noise"], data[f"{n}/truth"]) for n in names}
    found = {}
    for run in runs:
        truth = json.loads((run / "clusters.json").read_text())["truth"]
        found[run.name] = (
            np.load(run / "W.npy"),
            np.load(run / "noise.npy"),
            np.array([truth[str(i)] for i in range(len(truth))]),
        )
    return found


def synthetic(
    W: np.ndarray, noise: np.ndarray, truth: np.ndarray, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W, noise, truth) of `size` silos, silo i a copy of a recorded silo of cluster i mod K
    (module docstring)."""
    groups = [np.flatnonzero(truth == k) for k in np.unique(truth)]
    source = np.array([rng.choice(groups[i % len(groups)]) for i in range(size)])
    big = W[np.ix_(source, source)]
    for i in range(size):  # copies of one recorded silo: a recorded entry of s(i) inside its cluster
        twins = np.flatnonzero(source == source[i])
        mates = groups[i % len(groups)]
        mates = mates[mates != source[i]]
        big[i, twins] = W[source[i], rng.choice(mates, len(twins))]
        big[i, i] = 0.0
    return big, noise[source], truth[source]


def replay(
    W: np.ndarray, noise: np.ndarray, sample: int, representatives: int, seed: int, one_way: bool
) -> tuple[np.ndarray, int, int, float | None]:
    """(labels, pairs measured, directions measured, margin) of one staged plan looking W up."""
    C = len(W)
    plan = StagedPlan(
        list(range(C)),
        C,
        sample=sample,
        representatives=representatives,
        noise_multiple=CUT,
        rng=np.random.default_rng(seed),
        retest=RETEST,
        one_way=one_way,
    )
    measured = np.full_like(W, np.nan)
    np.fill_diagonal(measured, 0.0)
    directions = 0
    while (wanted := plan.next_pairs(measured, noise)) is not None:
        r, c = np.array(wanted, dtype=np.int64).reshape(-1, 2).T
        measured[r, c] = W[r, c]
        directions += len(wanted)
    pairs = sum(stage.pairs for stage in plan.stages)
    return plan.labels, pairs, directions, partition_report(measured, plan.labels, noise, CUT).margin


def rows(
    name: str,
    W: np.ndarray,
    noise: np.ndarray,
    truth: np.ndarray,
    seeds: int,
    settings: tuple[tuple[int, int], ...],
    ways: tuple[bool, ...],
) -> list[str]:
    C = len(W)
    full, report = extract_clusters(W, rule="robust", noise=noise, noise_multiple=CUT)
    every = C * (C - 1) // 2
    out = [
        f"| {name} | {C} | all pairs | {adjusted_rand_score(truth, full):.3f} | – | 1.000 | {every} (100 %) | "
        f"{2 * every} (100 %) | {report.margin:.2f} |"
    ]
    for (sample, reps), one_way in itertools.product(settings, ways):
        if sample >= C:
            continue
        start = time.monotonic()
        results = [replay(W, noise, sample, reps, seed, one_way) for seed in range(seeds)]
        truth_ari = [adjusted_rand_score(truth, labels) for labels, _, _, _ in results]
        full_ari = [adjusted_rand_score(full, labels) for labels, _, _, _ in results]
        pairs, directions = (np.mean([r[i] for r in results]) for i in (1, 2))
        margins = [m for _, _, _, m in results if m is not None]
        margin = f"{np.mean(margins):.2f} (min {np.min(margins):.2f})" if margins else "–"
        plan = f"staged {sample}/{reps}{', one way' if one_way else ''}"
        out.append(
            f"| {name} | {C} | {plan} | {np.mean(truth_ari):.3f} | {np.min(truth_ari):.3f} | "
            f"{np.mean(full_ari):.3f} | {pairs:.0f} ({100 * pairs / every:.2f} %) | "
            f"{directions:.0f} ({50 * directions / every:.2f} %) | {margin} |"
        )
        print(f"  {name} {plan}: {time.monotonic() - start:.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run folders (default: the committed matrices)")
    parser.add_argument("--seeds", type=int, default=100, help="sample draws per plan setting")
    parser.add_argument("--scale", type=int, nargs="*", default=[], help="synthetic federation sizes")
    parser.add_argument(
        "--settings",
        nargs="*",
        default=[f"{s}/{r}" for s, r in SETTINGS],
        help="plan settings SAMPLE/REPRESENTATIVES (default: %(default)s)",
    )
    parser.add_argument(
        "--ways",
        choices=("both", "one", "compare"),
        default="compare",
        help="placing stages measured both ways, one way (the member's model), or each",
    )
    args = parser.parse_args()
    settings = tuple(tuple(int(x) for x in s.split("/")) for s in args.settings)
    ways = {"both": (False,), "one": (True,), "compare": (False, True)}[args.ways]
    table = [
        "| matrix | C | plan (sample/representatives) | ARI vs truth (mean) | min | ARI vs all-pairs "
        "(mean) | pairs measured (share) | directions (share) | margin (mean, min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (W, noise, truth) in recorded(args.runs).items():
        table += rows(name, W, noise, truth, args.seeds, settings, ways)
        for size in args.scale:
            big = synthetic(W, noise, truth, size, np.random.default_rng(size))
            table += rows(f"{name} → {size} (synthetic)", *big, max(args.seeds // 10, 5), settings, ways)
    print("\n".join(table))


if __name__ == "__main__":
    main()
