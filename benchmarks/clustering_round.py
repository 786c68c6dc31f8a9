"""EMD-CFL's clustering round at IFCA's scale against a clean training round, side by side.

    python -m benchmarks.clustering_round [--before TREE] [--repeats 3] [--silos 2400] [--ranks 3]

Runs `configs/rotated_mnist_ifca_shape.yaml` (the MNIST test split, C silos of 100 images,
the staged plan with one representative a cluster, seeded keys) for two rounds of one epoch
through `mpirun -n RANKS`, in this tree and, with `--before`, in another checkout, taking
turns, `repeats` times each; and FedAvg on the same config once a repeat, in this tree.

What the clustering adds is round 1's training and clustering less round 2's training (a clean
training round); its ratio to round 2's training is the figure this benchmark reports,
"clustering round / a training round". Round 1's training also holds the job's start-up (the
silos build their data and models while its clock runs), which FedAvg, clustering nothing,
shows as round 1's training less round 2's: the last column takes its mean off. Single runs of
the same tree spread by ±0.2 in the ratio on this 2-core machine (round 2's training alone by
±6 s), hence the repeats and the means.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from .runs import MNIST, ROOT, Job, machine, run_job

CONFIG = "configs/rotated_mnist_ifca_shape.yaml"
RUN = (f"data.root={MNIST}", "data.download=false", "train.rounds=2", "train.local_epochs=1")  # both strategies
EMDCFL = ("strategy.representatives=1", "strategy.pair_keys=seeded")


def phases(job: Job) -> tuple[float, float, float]:
    """(round 1's training, round 1's clustering, round 2's training), seconds."""
    first, second = job.records[0]["seconds"], job.records[1]["seconds"]
    return first["train"], first.get("clustering", 0.0), second["train"]


def stage_seconds(job: Job) -> str:
    """Round 1's pair-plan stages, seconds each (sample / representatives / retest)."""
    plan = job.records[0].get("pair_plan") or {"stages": []}
    return " / ".join(f"{s['seconds']:.1f}" for s in plan["stages"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout to run the same jobs in")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--silos", type=int, default=2400)
    parser.add_argument("--ranks", type=int, default=3)
    args = parser.parse_args()
    trees = ([("before", args.before)] if args.before else []) + [("this tree", ROOT)]
    common = [*RUN, f"silos={args.silos}"]
    print(machine())
    print(f"{CONFIG}, C = {args.silos}, mpirun -n {args.ranks}, {' '.join(RUN[2:] + EMDCFL)}\n")
    print(
        "| job | ARI | round 1: training + clustering (s) | round 2: training (s) | added (s) | "
        "added / round 2's training | stages (s) |\n|---|---|---|---|---|---|---|",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="cfl_bench_") as scratch:
        fedavg_config = Path(scratch) / "fedavg.yaml"  # the same config, its strategy section FedAvg's
        fedavg_config.write_text(
            yaml.safe_dump(yaml.safe_load((ROOT / CONFIG).read_text()) | {"strategy": {"name": "fedavg"}})
        )
        ratios, start_up = run_turns(args, trees, common, str(fedavg_config))
    print(f"\nFedAvg's round 1 trains {start_up:.2f} training rounds longer than its round 2 (start-up).\n")
    print("| tree | added / round 2's training: mean (min–max) | less FedAvg's start-up |\n|---|---|---|")
    for name, values in ratios.items():
        print(
            f"| {name} | {statistics.mean(values):.2f} ({min(values):.2f}–{max(values):.2f}) | "
            f"{statistics.mean(values) - start_up:.2f} |"
        )


def run_turns(
    args: argparse.Namespace, trees: list[tuple[str, Path]], common: list[str], fedavg_config: str
) -> tuple[dict[str, list[float]], float]:
    """Each tree's EMD-CFL job, then FedAvg's, `repeats` times, each printed as a row; the
    ratios by tree and FedAvg's mean start-up excess in training rounds."""
    ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
    excess: list[float] = []
    for repeat in range(args.repeats):
        for name, tree in trees:
            job = run_job(tree, CONFIG, [*common, *EMDCFL], args.ranks)
            train1, clustering, train2 = phases(job)
            added = train1 + clustering - train2  # what the clustering adds to round 1
            ratios[name].append(added / train2)
            print(
                f"| {name} {repeat + 1} | {job.summary['ari']:.3f} | {train1:.1f} + {clustering:.1f} | {train2:.1f} | "
                f"{added:.1f} | {ratios[name][-1]:.2f} | {stage_seconds(job)} |",
                flush=True,
            )
        job = run_job(ROOT, fedavg_config, common, args.ranks)
        train1, _, train2 = phases(job)
        excess.append((train1 - train2) / train2)
        print(
            f"| FedAvg {repeat + 1} | – | {train1:.1f} + 0 | {train2:.1f} | {train1 - train2:.1f} | "
            f"{excess[-1]:.2f} | – |",
            flush=True,
        )
    return ratios, statistics.mean(excess)


if __name__ == "__main__":
    main()
