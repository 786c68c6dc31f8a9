"""EMD-CFL against the Oracle, whole jobs, the code before a change against this tree.

    python -m benchmarks.whole_job BEFORE_TREE [--quick]

For each case (data set, silos; T = 2 rounds, E = 1 local epoch, one silo per rank) it runs,
back to back, the Oracle and EMD-CFL in this tree and EMD-CFL in BEFORE_TREE, and prints
the emdcfl/oracle wall ratio of each tree, the clustering phase after/before, and this
tree's breakdown of the clustering round (metrics.jsonl: `silo_steps`, `server_steps`).
The Oracle's code path is the same in both trees, so one Oracle run serves both ratios.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .runs import DIGITS, MNIST, MNIST_TEST, ROOT, Job, clustering_s, run_job

COMMON = ["train.rounds=2", "train.local_epochs=1", "strategy.pair_keys=seeded"]


def cases(quick: bool) -> list[tuple[str, tuple[str, tuple[str, ...]], int]]:
    mnist = [("MNIST test split", MNIST_TEST, c) for c in ((8,) if quick else (8, 16))] if MNIST.is_dir() else []
    return mnist + ([] if quick else [("digits", DIGITS, 8), ("digits", DIGITS, 16)])


def breakdown(job: Job) -> str:
    """The clustering round's steps: silo means (max) and the server's receive/solve split."""
    first = next(r for r in job.records if "silo_steps" in r)
    silo = ", ".join(f"{k} {v['mean']:.1f} ({v['max']:.1f})" for k, v in first["silo_steps"].items())
    server = first.get("server_steps", {})
    threads = server.get("w1_pool_threads", 1)
    busy = server.get("w1_solves", 0.0) / max(1e-9, threads * first["seconds"]["clustering"])
    return (f"silo steps, mean (max) s: {silo}; server: receive {server.get('receive', 0):.1f} s, "
            f"W1 solves {server.get('w1_solves', 0):.1f} thread-s on {threads} threads, "
            f"after the last message {server.get('w1_after_last_message', 0):.2f} s; "
            f"server busy {100 * busy:.0f} % of the clustering phase")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--quick", action="store_true", help="MNIST test split at 8 silos only")
    args = parser.parse_args(argv)
    print("| case | oracle s | emdcfl before s | emdcfl after s | emdcfl/oracle before | emdcfl/oracle after "
          "| clustering before s | clustering after s | clustering after/before |")
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for name, (config, overrides), silos in cases(args.quick):
        sets = [*overrides, *COMMON, f"silos={silos}"]
        oracle = run_job(ROOT, config, [*sets, "strategy.name=oracle"], silos + 1)
        before = run_job(args.before, config, sets, silos + 1)
        after = run_job(ROOT, config, sets, silos + 1)
        cb, ca = clustering_s(before), clustering_s(after)
        print(f"| {name}, {silos} silos | {oracle.wall_s:.0f} | {before.wall_s:.0f} | {after.wall_s:.0f} "
              f"| {before.wall_s / oracle.wall_s:.2f} | {after.wall_s / oracle.wall_s:.2f} | {cb:.1f} | {ca:.1f} "
              f"| {ca / cb:.2f} |", flush=True)
        same = before.records[0]["clusters"] == after.records[0]["clusters"]
        notes.append(f"- {name}, {silos} silos: clusters {'identical' if same else 'DIFFER'} before/after; "
                     + breakdown(after))
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
