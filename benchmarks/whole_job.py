"""EMD-CFL against the Oracle, whole jobs, the code before a change against this tree.

    python -m benchmarks.whole_job BEFORE_TREE [--quick] [--repeats N]

For each case (data set, silos; T = 2 rounds, E = 1 local epoch, one silo per rank) it runs,
back to back, the Oracle and EMD-CFL in this tree and EMD-CFL in BEFORE_TREE, and prints
the emdcfl/oracle wall ratio of each tree, the clustering phase after/before, and this
tree's breakdown of the clustering round (metrics.jsonl: `silo_steps`, `server_steps`).
The Oracle's code path is the same in both trees, so one Oracle run serves both ratios.
With `--repeats N` the three jobs run N times, interleaved, and the figures are the medians
(a single Oracle run here swung 68-77 s between two suites); each emdcfl/oracle ratio is the
median of the ratios to the Oracle run just before.
"""

from __future__ import annotations

import argparse
import statistics
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
    return (
        f"silo steps, mean (max) s: {silo}; server: receive {server.get('receive', 0):.1f} s, "
        f"W1 solves {server.get('w1_solves', 0):.1f} thread-s on {threads} threads, "
        f"after the last message {server.get('w1_after_last_message', 0):.2f} s; "
        f"server busy {100 * busy:.0f} % of the clustering phase"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--quick", action="store_true", help="MNIST test split at 8 silos only")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each job; medians are printed")
    args = parser.parse_args(argv)
    print(
        "| case | oracle s | emdcfl before s | emdcfl after s | emdcfl/oracle before | emdcfl/oracle after "
        "| clustering before s | clustering after s | clustering after/before |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for name, (config, overrides), silos in cases(args.quick):
        sets = [*overrides, *COMMON, f"silos={silos}"]
        runs: dict[str, list[Job]] = {"oracle": [], "before": [], "after": []}
        for _ in range(args.repeats):
            runs["oracle"].append(run_job(ROOT, config, [*sets, "strategy.name=oracle"], silos + 1))
            runs["before"].append(run_job(args.before, config, sets, silos + 1))
            runs["after"].append(run_job(ROOT, config, sets, silos + 1))
        walls = {k: statistics.median(j.wall_s for j in jobs) for k, jobs in runs.items()}
        ratio = {
            k: statistics.median(j.wall_s / o.wall_s for j, o in zip(runs[k], runs["oracle"]))
            for k in ("before", "after")
        }  # each against the Oracle run just before it
        cb, ca = (statistics.median(clustering_s(j) for j in runs[k]) for k in ("before", "after"))
        print(
            f"| {name}, {silos} silos | {walls['oracle']:.0f} | {walls['before']:.0f} | {walls['after']:.0f} "
            f"| {ratio['before']:.2f} | {ratio['after']:.2f} | {cb:.1f} | {ca:.1f} | {ca / cb:.2f} |",
            flush=True,
        )
        if args.repeats > 1:
            notes.append(
                f"- {name}, {silos} silos, each run (oracle / before / after s): "
                + "; ".join(
                    f"{o.wall_s:.0f} / {b.wall_s:.0f} / {a.wall_s:.0f}"
                    for o, b, a in zip(runs["oracle"], runs["before"], runs["after"])
                )
            )
        same = all(b.records[0]["clusters"] == a.records[0]["clusters"] for b, a in zip(runs["before"], runs["after"]))
        notes.append(
            f"- {name}, {silos} silos: clusters {'identical' if same else 'DIFFER'} before/after; "
            + breakdown(runs["after"][-1])
        )
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
