"""Secure aggregation's cost: plain and secure rounds side by side in one run.

    python -m benchmarks.secure_aggregation [--setups quick,many] [--repeats 3] [--rounds 4]

quick: the quick start (configs/digits.yaml: 8 silos on 8 ranks under mpirun). many: 400
silos of the rotated MNIST test split in IFCA's regime (configs/ifca_rotated_mnist_test_split.yaml:
IFCA's MLP, the staged pair plan) on 2 silo ranks. Each runs EMD-CFL with
`aggregation.screen: false`, once in the clear and once with `aggregation.secure: true`,
interleaved `repeats` times. A round's seconds are the sum of its phases in metrics.jsonl,
over the rounds after the first (the first is EMD-CFL's clustering round, the same work in
both); a silo's bytes are what it sends a round, every kind together. Prints the medians and
their ratios (and each interleaved pair's), then one silo's masking on one thread for the
quick start's simple CNN and IFCA's MLP, and writes benchmarks/results/<date>-secure-aggregation.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from .runs import DIGITS, MNIST, ROOT, Job, machine, run_job

SETUPS = {  # name: (config, overrides, ranks, what it is)
    "quick": (DIGITS[0], [*DIGITS[1]], 9, "the quick start, 8 silos on 8 ranks"),
    "many": (
        "configs/ifca_rotated_mnist_test_split.yaml",
        ["silos=400", f"data.root={MNIST}", "data.download=false"],
        3,
        "400 silos of the rotated MNIST test split (IFCA's MLP, staged pairs) on 2 silo ranks",
    ),
}
SETTINGS = {"plain": ["aggregation.screen=false"], "secure": ["aggregation.screen=false", "aggregation.secure=true"]}


def round_seconds(job: Job) -> float:
    """The median wall seconds of the job's rounds after the first."""
    return statistics.median(sum(r["seconds"].values()) for r in job.records[1:])


# The kinds the server sends (the rest are the silos').
SERVER_KINDS = ("model", "control", "plan", "secure_setup", "forwarded_shares", "unmask_request")


def silo_bytes(job: Job) -> float:
    """The bytes a silo sends in a round after the first, every kind together (median)."""
    return statistics.median(
        sum(n for kind, n in r["bytes"].items() if kind not in SERVER_KINDS) / len(r["accuracy"])
        for r in job.records[1:]
    )


# (what, values, neighbours): the simple CNN of the quick start in a cluster of 8 and of 13,
# IFCA's MLP in a cluster of 100 (2⌈log₂ 100⌉ neighbours)
MASKINGS = (("simple CNN", 878_000, 7), ("simple CNN", 878_000, 12), ("IFCA's MLP", 159_000, 14))


def masking_ms(values: int, neighbours: int, repeats: int = 7) -> float:
    """One silo's `masked` of `values` words with `neighbours` pair secrets: the median ms."""
    import os

    import numpy as np
    from threadpoolctl import threadpool_limits

    from cfl_mpi.privacy.masking import masked

    words = np.random.default_rng(0).integers(0, 2**63, values, dtype=np.uint64)
    secrets = {other: os.urandom(32) for other in range(1, neighbours + 1)}
    times = []
    with threadpool_limits(1):
        for _ in range(repeats + 1):
            start = time.perf_counter()
            masked(words, 0, secrets)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="quick,many")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    lines = [
        "# Secure aggregation's cost: rounds in the clear and masked, side by side",
        "",
        f"`python -m benchmarks.secure_aggregation --setups {args.setups} --repeats {args.repeats} "
        f"--rounds {args.rounds}`; {machine()}",
        "",
        "| setup | | round (s, median of rounds 2..) | a silo's bytes a round | final avg accuracy |",
        "|---|---|---|---|---|",
    ]
    for setup in args.setups.split(","):
        config, overrides, ranks, what = SETUPS[setup]
        common = [*overrides, f"train.rounds={args.rounds}", "strategy.pair_keys=seeded"]
        jobs: dict[str, list[Job]] = {name: [] for name in SETTINGS}
        for repeat in range(args.repeats):
            for name, sets in SETTINGS.items():
                job = run_job(ROOT, config, [*common, *sets], ranks=ranks)
                jobs[name].append(job)
                print(f"{setup} {repeat + 1} {name}: round {round_seconds(job):.2f} s, {silo_bytes(job) / 1e6:.3f} MB")
        seconds = {name: statistics.median(round_seconds(j) for j in runs) for name, runs in jobs.items()}
        sent = {name: statistics.median(silo_bytes(j) for j in runs) for name, runs in jobs.items()}
        accuracy = {name: statistics.median(j.summary["avg_acc"] for j in runs) for name, runs in jobs.items()}
        lines += [
            *(
                f"| {what} | {name} | {seconds[name]:.2f} | {sent[name] / 1e6:.3f} MB | {100 * accuracy[name]:.2f} % |"
                for name in SETTINGS
            ),
            f"| | secure / plain | {seconds['secure'] / seconds['plain']:.2f}x "
            f"| {sent['secure'] / sent['plain']:.2f}x | |",
            "| | each interleaved pair | "
            + ", ".join(f"{round_seconds(b) / round_seconds(a):.2f}x" for a, b in zip(jobs["plain"], jobs["secure"]))
            + " | | |",
        ]
    lines += [
        "",
        "A silo's masking, one thread (median of 7):",
        "",
        "| model | values | neighbours | ms |",
        "|---|---|---|---|",
    ]
    lines += [f"| {what} | {values:,} | {k} | {masking_ms(values, k):.1f} |" for what, values, k in MASKINGS]
    print("\n".join(lines))
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{time.strftime('%Y%m%d')}-secure-aggregation.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
