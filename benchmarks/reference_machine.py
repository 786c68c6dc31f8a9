"""The GPU node as the reference machine: what a whole job spends beside training, against its goals.

    python -m benchmarks.reference_machine [--profile gpu|cpu] [--only NAME ...] [--repeats 3] [--mnist DIR]

Runs whole `mpirun` jobs of this tree and prints one table: each goal, the figure measured,
the target and whether it is met. The profile defaults to `gpu` where torch sees CUDA.

`gpu` (one GPU node, 16 or more cores; all silo ranks share the GPU):
- quick_start: the README's quick start (9 ranks, digits): wall, ARI, its clustering round;
- wide: 41 ranks, 40 silos of 1,500 MNIST test-split images, T = 2, E = 5, EMD-CFL and the
  Oracle taking turns `repeats` times: whole command EMD-CFL / Oracle ≤ 1.10 (median of the
  ratios to the Oracle just before), clustering round ≤ 1 training round (round 2's);
- c2400: 2,400 silos of 100 images (IFCA's shape, the staged plan) on 16 silo ranks, T = 2:
  clustering round ≤ 2 training rounds; the server's solve seconds per measured direction;
- startup: 41 ranks to the first round ≤ 1.2 × 41 torch imports with CUDA initialised
  (benchmarks/startup.py, whose timeline is printed too).

`cpu` (this project's 2-core machine):
- noise: the quick start in the simulator, round 1: the silos' noise step ≤ 0.5 s (mean);
- pair8: 8 silo ranks of the MNIST test split, T = 2, E = 1, EMD-CFL / Oracle ≤ 1.10, median
  of `repeats` interleaved pairs;
- c2400: 2,400 silos on 2 silo ranks, one representative a cluster (as
  benchmarks/clustering_round.py): the server's solve ≤ 1 ms per direction, clustering round
  ≤ 2 training rounds;
- startup: 41 ranks to the first round ≤ 1.2 × 41 torch imports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .clustering_round import EMDCFL
from .runs import DIGITS, MNIST, ROOT, Job, run_job

IFCA_SHAPE = "configs/rotated_mnist_ifca_shape.yaml"
MNIST_TEST = "configs/rotated_mnist_test.yaml"


@dataclass
class Goal:
    name: str
    measured: float
    target: float | None  # None: a figure reported, with no goal of its own
    unit: str = ""
    note: str = ""

    def row(self) -> str:
        if self.target is None:
            return f"| {self.name} | {self.measured:.3g}{self.unit} | – | – | {self.note} |"
        met = "yes" if self.measured <= self.target else "**no**"
        return f"| {self.name} | {self.measured:.3g}{self.unit} | ≤ {self.target:g}{self.unit} | {met} | {self.note} |"


def mnist_sets(mnist: Path) -> list[str]:
    return [f"data.root={mnist}", "data.download=false"]


def clustering_round(job: Job) -> tuple[float, float]:
    """(round 1's clustering phase, round 2's training phase), seconds."""
    return job.records[0]["seconds"].get("clustering", 0.0), job.records[1]["seconds"]["train"]


def solve_ms_per_direction(job: Job, silos: int, step: str = "w1_solves") -> float:
    """The server's solve thread-seconds of round 1 (wall, or CPU with `w1_solves_cpu`) per
    direction W[r][c] measured, in ms."""
    first = job.records[0]
    plan = first.get("pair_plan")
    directions = sum(s["directions"] for s in plan["stages"]) if plan else silos * (silos - 1)
    return 1000 * first.get("server_steps", {}).get(step, 0.0) / max(1, directions)


def whole_job_pair(config: str, sets: list[str], ranks: int, repeats: int) -> tuple[float, list[Job], list[Job]]:
    """EMD-CFL and the Oracle taking turns; the median of each EMD-CFL wall over the Oracle's just before."""
    oracles, emdcfls = [], []
    for _ in range(repeats):
        oracles.append(run_job(ROOT, config, [*sets, "strategy.name=oracle"], ranks))
        emdcfls.append(run_job(ROOT, config, [*sets, "strategy.name=emdcfl"], ranks))
    ratio = statistics.median(e.wall_s / o.wall_s for e, o in zip(emdcfls, oracles))
    return ratio, oracles, emdcfls


def walls(jobs: list[Job]) -> str:
    return "/".join(f"{j.wall_s:.1f}" for j in jobs)


def quick_start() -> list[Goal]:
    config, overrides = DIGITS
    job = run_job(ROOT, config, list(overrides), 9)
    clustering = job.records[0]["seconds"].get("clustering", 0.0)
    return [
        Goal(
            "quick start: whole command",
            job.wall_s,
            None,
            " s",
            f"ARI {job.summary.get('ari'):.2f}, clustering round {clustering:.1f} s",
        )
    ]


def noise_step() -> list[Goal]:
    """The quick start in the simulator, one round: the silos' mean noise step."""
    config, _ = DIGITS
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "cfl_mpi.backends.simulate", config, "--out", out, "--set", "train.rounds=1"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        first = json.loads((Path(out) / "metrics.jsonl").read_text().splitlines()[0])
    steps = first["silo_steps"]
    return [
        Goal(
            "quick start (simulator): silo noise step, mean",
            steps["noise"]["mean"],
            0.5,
            " s",
            f"max {steps['noise']['max']:.2f} s; clustering round {first['seconds'].get('clustering', 0):.1f} s",
        )
    ]


def wide(mnist: Path, repeats: int, gpu: bool) -> list[Goal]:
    silos, images, epochs = (40, 1500, 5) if gpu else (8, None, 1)
    sets = [
        *mnist_sets(mnist),
        f"silos={silos}",
        "train.rounds=2",
        f"train.local_epochs={epochs}",
        "strategy.pair_keys=seeded",
        *([f"data.silo_images={images}"] if images else []),
    ]
    ratio, oracles, emdcfls = whole_job_pair(MNIST_TEST, sets, silos + 1, repeats)
    clustering, training = zip(*(clustering_round(j) for j in emdcfls))  # round 1's; round 2's training
    name = f"{silos + 1} ranks, MNIST test split" + (f", {images} images a silo, E = {epochs}" if images else ", E = 1")
    steps = emdcfls[-1].records[0].get("silo_steps", {})
    silo_steps = ", ".join(f"{k} {v['mean']:.1f}" for k, v in steps.items())
    goals = [
        Goal(
            f"{name}: EMD-CFL / Oracle, whole command",
            ratio,
            1.10,
            "",
            f"walls EMD-CFL {walls(emdcfls)} s, Oracle {walls(oracles)} s; clustering round "
            f"{statistics.median(clustering):.1f} s, silo steps (mean s) {silo_steps}",
        )
    ]
    if gpu:
        goals.append(
            Goal(
                f"{name}: clustering round / a training round",
                statistics.median(clustering) / statistics.median(training),
                1.0,
                "",
                f"clustering {statistics.median(clustering):.1f} s, "
                f"round 2's training {statistics.median(training):.1f} s",
            )
        )
    return goals


def c2400(mnist: Path, gpu: bool) -> list[Goal]:
    ranks = 17 if gpu else 3
    settings = ["strategy.pair_keys=seeded"] if gpu else list(EMDCFL)  # the GPU check's; clustering_round's
    job = run_job(
        ROOT, IFCA_SHAPE, [*mnist_sets(mnist), "silos=2400", "train.rounds=2", "train.local_epochs=1", *settings], ranks
    )
    clustering, training = clustering_round(job)
    name = f"C = 2,400 on {ranks - 1} silo ranks"
    return [
        Goal(
            f"{name}: clustering round / a training round",
            clustering / training,
            2.0,
            "",
            f"clustering {clustering:.1f} s, round 2's training {training:.1f} s, ARI {job.records[0]['ari']:.2f}",
        ),
        Goal(
            f"{name}: server solve per direction",
            solve_ms_per_direction(job, 2400),
            1.0,
            " ms",
            f"{job.records[0].get('server_steps', {}).get('w1_solves', 0):.1f} thread-s on "
            f"{job.records[0].get('server_steps', {}).get('w1_pool_threads', 1)} threads, of which "
            f"computing {solve_ms_per_direction(job, 2400, 'w1_solves_cpu'):.2f} ms a direction",
        ),
    ]


def startup(gpu: bool) -> tuple[list[Goal], str]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.startup", "--ranks", "41"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = out.splitlines()
    ratio = float(lines[0].rsplit("ratio", 1)[1])
    note = lines[0].split(";")[0]
    if gpu and len(lines) > 1 and "CUDA" in lines[1]:
        ratio = float(lines[1].rsplit("ratio", 1)[1])
        note = lines[1].strip()
    return [Goal("41 ranks to the first round / the floor" + (" with CUDA" if gpu else ""), ratio, 1.2, "", note)], out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["gpu", "cpu"])
    parser.add_argument("--only", nargs="+", choices=["quick_start", "noise", "wide", "pair8", "c2400", "startup"])
    parser.add_argument("--repeats", type=int, default=None, help="interleaved EMD-CFL/Oracle pairs (gpu 1, cpu 3)")
    parser.add_argument("--mnist", type=Path, default=MNIST, help="the MNIST IDX files' folder")
    args = parser.parse_args(argv)
    import torch

    profile = args.profile or ("gpu" if torch.cuda.is_available() else "cpu")
    gpu = profile == "gpu"
    steps = args.only or (
        ["quick_start", "wide", "c2400", "startup"] if gpu else ["noise", "pair8", "c2400", "startup"]
    )
    repeats = args.repeats or (1 if gpu else 3)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"profile {profile} ({device}); steps {' '.join(steps)}\n", flush=True)
    goals: list[Goal] = []
    extra = []
    for step in steps:
        if step == "quick_start":
            goals += quick_start()
        elif step == "noise":
            goals += noise_step()
        elif step in ("wide", "pair8"):
            goals += wide(args.mnist, repeats, gpu)
        elif step == "c2400":
            goals += c2400(args.mnist, gpu)
        elif step == "startup":
            found, out = startup(gpu)
            goals += found
            extra.append(out)
        print(goals[-1].row(), flush=True)
    print("\n| goal | measured | target | met | note |\n|---|---|---|---|---|")
    print("\n".join(g.row() for g in goals))
    for out in extra:
        print("\n" + out)


if __name__ == "__main__":
    main()
