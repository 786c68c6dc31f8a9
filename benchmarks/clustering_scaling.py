"""EMD-CFL's clustering round against the number of silos C, before a change and in this tree.

    python -m benchmarks.clustering_scaling BEFORE_TREE [--quick] [--silos 4 8 16 32 40]

One round (E = 1) on the MNIST test split (digits if absent), min(C, 8) silo ranks; prints
the clustering phase of each tree, their ratio, this tree's bytes per message kind, and the
fitted growth: wall ≈ a + b·C + c·C² (least squares) and each kind's exponent k in bytes ∝ C^k.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .runs import DIGITS, MNIST, MNIST_TEST, ROOT, clustering_s, run_job
from .whole_job import breakdown

KINDS = ("plan", "handshake", "embedding_model", "embeddings")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--quick", action="store_true", help="C in 4, 8, 16")
    parser.add_argument("--silos", type=int, nargs="+", default=[4, 8, 16, 32, 40])
    args = parser.parse_args(argv)
    counts = [c for c in args.silos if c <= 16] if args.quick else args.silos
    config, overrides = MNIST_TEST if MNIST.is_dir() else DIGITS
    sets = [*overrides, "train.rounds=1", "train.local_epochs=1", "strategy.pair_keys=seeded"]
    print(f"data: {config}; " + " ".join(sets[len(overrides) :]))
    print(
        "| C | ranks | clustering before s | clustering after s | after/before | "
        + " | ".join(f"{k} bytes" for k in KINDS)
        + " | server PSS MB | silo rank PSS MB (max) |"
    )
    print("|---" * (7 + len(KINDS)) + "|")
    walls: dict[str, list[float]] = {"before": [], "after": []}
    sent: dict[str, list[int]] = {k: [] for k in KINDS}
    steps = []
    for c in counts:
        ranks = min(c, 8) + 1
        before = run_job(args.before, config, [*sets, f"silos={c}"], ranks)
        after = run_job(ROOT, config, [*sets, f"silos={c}"], ranks)
        walls["before"].append(clustering_s(before))
        walls["after"].append(clustering_s(after))
        for k in KINDS:
            sent[k].append(after.records[0]["bytes"].get(k, 0))
        steps.append(f"- C = {c}: {breakdown(after)}")
        print(
            f"| {c} | {ranks} | {walls['before'][-1]:.1f} | {walls['after'][-1]:.1f} "
            f"| {walls['after'][-1] / walls['before'][-1]:.2f} | "
            + " | ".join(str(sent[k][-1]) for k in KINDS)
            + f" | {after.pss_mb.get(0, float('nan')):.0f}"
            + f" | {max(after.pss_mb.get(r, 0.0) for r in range(1, ranks)):.0f} |",
            flush=True,
        )
    print("\nThis tree's clustering round:\n" + "\n".join(steps))
    if len(counts) >= 3:
        x = np.array(counts, dtype=float)
        for tree, wall in walls.items():
            c2, c1, c0 = np.polyfit(x, wall, 2)
            print(
                f"\n{tree}: clustering wall ≈ {c0:.2f} + {c1:.3f}·C + {c2:.4f}·C² s "
                f"(the C² term is {100 * c2 * x[-1] ** 2 / max(1e-9, wall[-1]):.0f} % at C = {counts[-1]})"
            )
        print(
            "\nbytes ∝ C^k: "
            + ", ".join(f"{k} k = {np.polyfit(np.log(x), np.log(np.maximum(sent[k], 1)), 1)[0]:.2f}" for k in KINDS)
        )


if __name__ == "__main__":
    main()
