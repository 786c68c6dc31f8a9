"""Accuracy against the privacy budget: `privacy.dp` at ε = 1, 3 and 8 (δ = 1e-5) beside the same
job without DP, for each config and mode (`central`: the server adds the noise; `distributed`:
the silos do, under `aggregation.secure`); the noise multiplier of each budget is the smallest
that fits it over the config's rounds (`noise_multiplier_for`).

    python -m benchmarks.dp_accuracy [--configs digits,mnist16] [--epsilons 1,3,8] [--clip 0.01]
                                     [--modes central,distributed]

digits: the quick start (configs/digits.yaml: 8 silos in 4 clusters of 2). mnist16: 16 silos of
the rotated MNIST test split (4 clusters of 4; MNIST's IDX files in $CFL_MPI_MNIST or data/mnist).
Each job runs in the simulator with seeded pair keys and seeded noise, so a row is repeatable.
Writes benchmarks/results/<date>-dp-accuracy.md and a plot of accuracy against ε beside it (.png).
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
MODES = {  # privacy.dp mode: what else it sets
    "central": [],
    "distributed": ["aggregation.secure=true", "aggregation.screen=false"],
}


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
    parser.add_argument("--modes", default="central,distributed")
    parser.add_argument("--out", type=Path, default=Path("runs/dp_accuracy"))
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    rows = []
    for name in args.configs.split(","):
        config, sets = CONFIGS[name]
        sets = [*sets, "strategy.pair_keys=seeded"]
        rounds = load_config(ROOT / config, sets).train.rounds
        jobs: list[tuple[str, float | None]] = [("none", None)]
        jobs += [(mode, float(e)) for mode in args.modes.split(",") for e in args.epsilons.split(",")]
        for mode, budget in jobs:
            private, z = [], None
            if budget is not None:
                z = noise_multiplier_for(budget, rounds, DELTA)
                private = [f"privacy.dp={mode}", f"privacy.clip={args.clip}", f"privacy.noise_multiplier={z}"]
                private += [f"privacy.epsilon={budget}", "privacy.noise=seeded", *MODES[mode]]
            start = time.perf_counter()
            tag = "none" if budget is None else f"{mode}_eps{budget:g}"
            summary = run(config, [*sets, *private], args.out / f"{name}_{tag}")
            seconds = time.perf_counter() - start
            rows.append((name, rounds, mode, budget, z, summary, seconds))
            print(name, tag, z, summary, f"{seconds:.0f} s", flush=True)
    lines = [
        "# Accuracy against the privacy budget (privacy.dp: central and distributed)",
        "",
        "```bash",
        f"python -m benchmarks.dp_accuracy --configs {args.configs} --epsilons {args.epsilons} --clip {args.clip} "
        f"--modes {args.modes}",
        "```",
        "",
        f"EMD-CFL with its defaults, seeded pair keys and noise; C = {args.clip:g}, δ = {DELTA:g}; z: the smallest "
        "noise multiplier whose rounds spend at most the budget. distributed: the silos add the noise under "
        "secure aggregation (screening off). Accuracy on each silo's test set after the last round.",
        "",
        "| config | rounds | dp | ε budget | z | ε spent | ARI | avg acc (%) | worst acc (%) | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rounds, mode, budget, z, summary, seconds in rows:
        shown = ("no DP", "-") if budget is None or z is None else (f"{budget:g}", f"{z:g}")
        head = f"| {name} | {rounds} | {mode} | {shown[0]} | {shown[1]} "
        if isinstance(summary, str):
            lines.append(head + f"| failed: {summary} | | | | {seconds:.0f} |")
            continue
        spent = summary.get("privacy", {}).get("epsilon")
        accuracy = f"{100 * summary['avg_acc']:.1f} | {100 * summary['worst_acc']:.1f}"
        lines.append(
            head + f"| {'-' if spent is None else f'{spent:.3f}'} | {summary['ari']:.2f} | {accuracy} | {seconds:.0f} |"
        )
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"{time.strftime('%Y%m%d')}-dp-accuracy.md"
    out.write_text("\n".join(lines) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def plot(rows: list[tuple], path: Path) -> None:
    """Average accuracy against ε, one line per config and mode, the job without DP dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = sorted({r[0] for r in rows})
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for name in names:
        for mode, marker, line in (("central", "o", "-"), ("distributed", "s", ":")):
            points = [
                (r[3], 100 * r[5]["avg_acc"]) for r in rows if r[0] == name and r[2] == mode and isinstance(r[5], dict)
            ]
            if points:
                ax.plot(*zip(*points), marker=marker, linestyle=line, color=colours[name], label=f"{name}, {mode}")
        clear = [100 * r[5]["avg_acc"] for r in rows if r[0] == name and r[3] is None and isinstance(r[5], dict)]
        if clear:
            ax.axhline(clear[0], linestyle="--", color=colours[name], label=f"{name}, no DP")
    ax.set_xscale("log")
    budgets = sorted({r[3] for r in rows if r[3] is not None})
    ax.set_xticks(budgets, [f"{e:g}" for e in budgets])
    ax.minorticks_off()
    ax.set_xlabel("ε budget (δ = 1e-5)")
    ax.set_ylabel("average silo accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("EMD-CFL: accuracy against the privacy budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
