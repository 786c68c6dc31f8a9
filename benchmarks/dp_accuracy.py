"""Accuracy against the privacy budget: `privacy.dp: central` at ε = 1, 3 and 8 (δ = 1e-5) beside
the same job without DP, for each config; the noise multiplier of each budget is the smallest
that fits it over the config's rounds (`noise_multiplier_for`).

    python -m benchmarks.dp_accuracy [--configs digits,mnist16] [--epsilons 1,3,8] [--clip 0.01]

digits: the quick start (configs/digits.yaml: 8 silos in 4 clusters of 2). mnist16: 16 silos of
the rotated MNIST test split (4 clusters of 4; MNIST's IDX files in $CFL_MPI_MNIST or data/mnist).
Each job runs in the simulator with seeded pair keys and seeded noise, so a row is repeatable.
Writes benchmarks/results/<date>-dp-accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from cfl_mpi.config import load_config
from cfl_mpi.privacy.dp import noise_multiplier_for

from .runs import MNIST, ROOT

CONFIGS = {
    "digits": ("configs/digits.yaml", []),
    "mnist16": ("configs/rotated_mnist_test.yaml", ["silos=16", f"data.root={MNIST}", "data.download=false"]),
}
DELTA = 1e-5


def run(config: str, sets: list[str], out: Path) -> dict | str:
    """One job in the simulator: its summary, or the line it failed with (a model the noise
    drove to NaN, say)."""
    command = [sys.executable, "-m", "cfl_mpi.backends.simulate", config, "--out", str(out), "--overwrite", "--quiet"]
    for assignment in sets:
        command += ["--set", assignment]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        return next((line for line in reversed(done.stderr.splitlines()) if "Error" in line), "failed")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="digits,mnist16")
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--clip", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("runs/dp_accuracy"))
    args = parser.parse_args()
    rows = []
    for name in args.configs.split(","):
        config, sets = CONFIGS[name]
        sets = [*sets, "strategy.pair_keys=seeded"]
        rounds = load_config(ROOT / config, sets).train.rounds
        budgets: list[float | None] = [None, *(float(e) for e in args.epsilons.split(","))]
        for budget in budgets:
            private = []
            z = None
            if budget is not None:
                z = noise_multiplier_for(budget, rounds, DELTA)
                private = ["privacy.dp=central", f"privacy.clip={args.clip}", f"privacy.noise_multiplier={z}"]
                private += [f"privacy.epsilon={budget}", "privacy.noise=seeded"]
            start = time.perf_counter()
            tag = "none" if budget is None else f"eps{budget:g}"
            summary = run(config, [*sets, *private], args.out / f"{name}_{tag}")
            seconds = time.perf_counter() - start
            rows.append((name, rounds, budget, z, summary, seconds))
            print(name, tag, z, summary, f"{seconds:.0f} s", flush=True)
    lines = [
        "# Accuracy against the privacy budget (privacy.dp: central)",
        "",
        "```bash",
        f"python -m benchmarks.dp_accuracy --configs {args.configs} --epsilons {args.epsilons} --clip {args.clip}",
        "```",
        "",
        f"EMD-CFL with its defaults, seeded pair keys and noise; C = {args.clip:g}, δ = {DELTA:g}; z: the smallest "
        "noise multiplier whose rounds spend at most the budget. Accuracy on each silo's test set after the "
        "last round.",
        "",
        "| config | rounds | ε budget | z | ε spent | ARI | avg acc (%) | worst acc (%) | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rounds, budget, z, summary, seconds in rows:
        shown = ("no DP", "-") if budget is None or z is None else (f"{budget:g}", f"{z:g}")
        head = f"| {name} | {rounds} | {shown[0]} | {shown[1]} "
        if isinstance(summary, str):
            lines.append(head + f"| failed: {summary} | | | | {seconds:.0f} |")
            continue
        spent = summary.get("privacy", {}).get("epsilon")
        accuracy = f"{100 * summary['avg_acc']:.1f} | {100 * summary['worst_acc']:.1f}"
        lines.append(
            head + f"| {'-' if spent is None else f'{spent:.3f}'} | {summary['ari']:.2f} | {accuracy} | {seconds:.0f} |"
        )
    out = ROOT / "benchmarks" / "results" / f"{time.strftime('%Y%m%d')}-dp-accuracy.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
