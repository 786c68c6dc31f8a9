"""Many small silos on few ranks: memory and clustering cost, side by side in one run.

    python -m benchmarks.many_silos [--before TREE] [--silos 100] [--ranks 3] [--plans all staged]
                                    [--placements one_way both_ways] [--config YAML] [--set key=value ...]

Runs `configs/rotated_mnist_small_silos.yaml` (or `--config`; the MNIST test split; narrow CNN,
one round of one epoch, seeded keys) through `mpirun -n RANKS` once per pair plan (the staged
plan once per placement), in this tree and, with `--before`, in another checkout (e.g.
`git worktree add /tmp/before HEAD~1`), interleaved.
Prints per job: ARI, peak PSS summed over ranks and per silo, the training and clustering
phases of round 1, the pairs measured, and the ratios to the first job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .runs import MNIST, ROOT, Job, clustering_s, machine, run_job

CONFIG = "configs/rotated_mnist_small_silos.yaml"
FIXED = (
    f"data.root={MNIST}",
    "data.download=false",
    "train.rounds=1",
    "model.channels=[16,32]",
    "model.embedding_dim=64",
    "strategy.pair_keys=seeded",
)


def row(label: str, job: Job, silos: int, first: Job) -> str:
    pss = sum(job.pss_mb.values())
    plan = job.records[0].get("pair_plan")
    pairs = plan["pairs"] if plan else silos * (silos - 1) // 2
    ratios = f"{pss / sum(first.pss_mb.values()):.2f} / {clustering_s(job) / max(clustering_s(first), 1e-9):.2f}"
    return (
        f"| {label} | {job.summary['ari']:.3f} | {pss / 1024:.2f} | {pss / silos:.1f} | "
        f"{job.records[0]['seconds']['train']:.1f} | {clustering_s(job):.1f} | {pairs} | {job.wall_s:.0f} | "
        f"{ratios} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout to run the same jobs in")
    parser.add_argument("--silos", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--plans", nargs="+", default=["all", "staged"], choices=["all", "staged"])
    parser.add_argument(
        "--placements",
        nargs="+",
        default=["one_way"],
        choices=["one_way", "both_ways"],
        help="the staged plan's strategy.placement, one job each",
    )
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    trees = ([("before", args.before)] if args.before else []) + [("this tree", ROOT)]
    print(machine())
    print(f"{args.config}, C = {args.silos}, mpirun -n {args.ranks}, {' '.join(FIXED[2:])} {' '.join(args.set)}\n")
    print(
        "| job | ARI | peak PSS (GiB, all ranks) | MB per silo | training (s) | clustering (s) | pairs | "
        "wall (s) | PSS / clustering vs first |\n|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    first = None
    jobs = [(plan, placement) for plan in args.plans for placement in (args.placements if plan == "staged" else [""])]
    for plan, placement in jobs:
        for name, tree in trees:
            sets = [f"strategy.placement={placement}"] if placement else []
            job = run_job(
                tree,
                args.config,
                [*FIXED, f"silos={args.silos}", f"strategy.pairs={plan}", *sets, *args.set],
                args.ranks,
            )
            first = first or job
            print(
                row(f"{name}, pairs: {plan}{f' ({placement})' if placement else ''}", job, args.silos, first),
                flush=True,
            )


if __name__ == "__main__":
    main()
