"""Federations nobody tuned for: every method with the product's defaults on real data cut into
sites the way other people cut them, and what each answers (clusters, ARI, EMD-CFL's margin,
average and worst-site accuracy against FedAvg's).

    python -m benchmarks.federations [--federations cancer_labs,mnist_dir0.3] [--methods emdcfl,fedavg,oracle]
        [--seeds 0,1,2] [--backend simulate|mpi] [--partitioner flwr|own] [--mnist DIR] [--out /tmp/federations]
        [--tree DIR] [--results benchmarks/results]
    python -m benchmarks.federations --report-only      # the table, plot and JSON of the runs done so far
    python -m benchmarks.federations --list             # the federations and how long the full grid takes

The federations (benchmarks/federation_data.py) are built once into OUT/data/<name>/ as silo
files (`.npz` a site, or PNG image folders) with a manifest and a run config, from MNIST's
IDX files (--mnist, else $CFL_MPI_MNIST, else data/mnist; the MNIST federations are left out
without them), scikit-learn's digits and its breast-cancer and wine tables; nothing is
downloaded. Each (federation, method, seed) is one job of the tree's `cfl_mpi.backends.simulate` (or
`cfl_mpi.main` under mpirun with one rank per silo) into OUT/runs/<backend>/<federation>/
<method>_s<seed>/, skipped where its summary.json exists; jobs run seed by seed, each seed over
every federation, so that a cut-short run has the first seed everywhere. The Oracle runs only
where the sites have true groups; without them IFCA's k and FedWaD's clusters are 2, which a
user must choose. Every run, the report goes to RESULTS/<date>-federations.md (every command
given so far at its top), .json (the raw summaries) and .png (worst-site accuracy, ARI and
clusters per federation and method), with the time the full grid would take.

`--tree DIR` runs the jobs of another checkout of cfl_mpi (its folder on PYTHONPATH), e.g. a
`git archive` of a commit while this tree is being edited. Flower Datasets (`pip install -e
'.[benchmarks]'`) cuts the sites; without it the command stops and says so, and
`--partitioner own` cuts them with this module's numpy recipes, labelled as such.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path

import numpy as np

from .federation_data import (
    FEDERATIONS,
    FLWR_MISSING,
    Federation,
    build,
    flwr_available,
    partitioner_label,
    run_config,
)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("emdcfl", "fedavg", "oracle", "fedwad", "pacfl", "cfl", "ifca")
NO_GROUP_K = 2  # IFCA's k and FedWaD's clusters where the sites have no true groups


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.federations", description=__doc__.split("\n")[0])
    parser.add_argument("--federations", default=",".join(FEDERATIONS), help="comma-separated (default: all)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--backend", choices=("simulate", "mpi"), default="simulate")
    parser.add_argument("--partitioner", choices=("flwr", "own"), default="flwr")
    parser.add_argument("--mnist", type=Path, default=Path(os.environ.get("CFL_MPI_MNIST") or ROOT / "data" / "mnist"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/federations"))
    parser.add_argument("--tree", type=Path, default=ROOT, help="the cfl_mpi checkout whose jobs run")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--title", default="the product's defaults", help="the report's heading")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    for name in args.federations.split(","):
        if name not in FEDERATIONS:
            parser.error(f"--federations: unknown federation {name!r} (choose from {', '.join(FEDERATIONS)})")
    for name in args.methods.split(","):
        if name not in METHODS:
            parser.error(f"--methods: unknown method {name!r} (choose from {', '.join(METHODS)})")
    if not all(part.strip().isdigit() for part in args.seeds.split(",")):
        parser.error(f"--seeds: give comma-separated non-negative integers, got {args.seeds!r}")
    splits = {FEDERATIONS[n].source.removeprefix("mnist_") for n in args.federations.split(",")} & {"train", "test"}
    if not args.report_only and not args.list and splits:
        from cfl_mpi.data.mnist import missing_files

        if missing := missing_files(args.mnist, tuple(sorted(splits))):
            parser.error(
                f"--mnist: {args.mnist} lacks {', '.join(missing)} (give the MNIST IDX folder, set $CFL_MPI_MNIST, "
                "or leave the mnist_* federations out of --federations)"
            )
    return args


def methods_for(fed: Federation, methods: list[str]) -> list[str]:
    """The methods that run on a federation: no Oracle without true groups."""
    return [m for m in methods if m != "oracle" or fed.grouped]


def overrides(fed: Federation, method: str, seed: int) -> list[str]:
    sets = [f"strategy.name={method}", f"seed={seed}"]
    if not fed.grouped and method == "ifca":
        sets.append(f"strategy.k={NO_GROUP_K}")
    if not fed.grouped and method == "fedwad":
        sets.append(f"strategy.clusters={NO_GROUP_K}")
    return sets


def ensure_built(fed: Federation, folder: Path, mnist: Path, partitioner: str) -> None:
    """Build the federation unless it is built already by the same recipe and partitioner."""
    meta = folder / "federation.json"
    if meta.is_file():
        held = json.loads(meta.read_text())
        same = held["federation"] == json.loads(json.dumps(asdict(fed)))
        if same and held["partitioner"] == partitioner_label(partitioner):
            (folder / "config.yaml").write_text(run_config(fed, folder))  # the run settings as this code has them
            return
    if folder.exists():
        shutil.rmtree(folder)
    started = time.monotonic()
    sites = build(fed, folder, mnist, partitioner)
    sizes = [s.examples for s in sites]
    print(
        f"{fed.name}: built {len(sites)} sites of {min(sizes)}-{max(sizes)} in {time.monotonic() - started:.1f} s",
        flush=True,
    )


def run_one(fed: Federation, method: str, seed: int, args: argparse.Namespace) -> Path:
    """One job; its results folder (summary.json missing where it failed: its log says why)."""
    run = args.out / "runs" / args.backend / fed.name / f"{method}_s{seed}"
    if (run / "summary.json").is_file():
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    config = args.out / "data" / fed.name / "config.yaml"
    start = (
        [str(Path(sys.executable).parent / "mpirun"), "-n", str(fed.sites + 1), sys.executable, "-m", "cfl_mpi.main"]
        if args.backend == "mpi"
        else [sys.executable, "-m", "cfl_mpi.backends.simulate"]
    )
    cmd = [
        *start,
        str(config),
        "--out",
        str(run),
        "--overwrite",
        *[a for s in overrides(fed, method, seed) for a in ("--set", s)],
    ]
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve()), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    with open(run.parent / f"{run.name}.log", "w") as log:
        log.write(shlex.join(cmd) + "\n")
        log.flush()
        code = subprocess.run(cmd, cwd=args.tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if code == 0 and (run / "summary.json").is_file():
        (run / "command_wall_s.txt").write_text(f"{wall:.2f}\n")
        s = json.loads((run / "summary.json").read_text())
        ari = "-" if s["ari"] is None else f"{s['ari']:.2f}"
        print(
            f"  {fed.name} {method} s{seed}: {s['n_clusters']} clusters, ARI {ari}, avg {100 * s['avg_acc']:.1f} %, "
            f"worst {100 * s['worst_acc']:.1f} %, {wall:.0f} s",
            flush=True,
        )
    else:
        print(
            f"  {fed.name} {method} s{seed}: FAILED (exit {code}, {wall:.0f} s): {run.parent / run.name}.log",
            flush=True,
        )
    return run


# ---------------------------------------------------------------------------------- the report
def collect(out: Path, names: list[str]) -> list[dict]:
    """Every finished run of the named federations under `out`, one dict each."""
    rows = []
    for summary in sorted((out / "runs").glob("*/*/*/summary.json")):
        run = summary.parent
        backend, fed = run.parent.parent.name, run.parent.name
        if fed not in names:
            continue
        s = json.loads(summary.read_text())
        wall = run / "command_wall_s.txt"
        ext = s.get("extraction") or {}
        rows.append(
            {
                "federation": fed,
                "backend": backend,
                "method": s["strategy"],
                "seed": s["seed"],
                "n_clusters": s["n_clusters"],
                "ari": s["ari"],
                "avg_acc": s["avg_acc"],
                "worst_acc": s["worst_acc"],
                "margin": ext.get("margin"),
                "gap": ext.get("gap"),
                "noise_clusters": ext.get("noise_clusters"),
                "max_within": ext.get("max_within"),
                "min_between": ext.get("min_between"),
                "paper_rule_clusters": (s.get("paper_rule") or {}).get("n_clusters"),
                "rounds_wall_s": s["wall_s"],
                "command_wall_s": float(wall.read_text()) if wall.is_file() else None,
            }
        )
    return rows


def _mean(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean over seeds per (federation, backend, method), with the worst site against FedAvg's
    in the same seeds."""
    fedavg_worst = {(r["federation"], r["backend"], r["seed"]): r["worst_acc"] for r in rows if r["method"] == "fedavg"}
    out = []
    keys = sorted(
        {(r["federation"], r["backend"], r["method"]) for r in rows},
        key=lambda k: (list(FEDERATIONS).index(k[0]), k[1], METHODS.index(k[2])),
    )
    for fed, backend, method in keys:
        mine = [r for r in rows if (r["federation"], r["backend"], r["method"]) == (fed, backend, method)]
        gaps = [
            r["worst_acc"] - fedavg_worst[fed, backend, r["seed"]]
            for r in mine
            if (fed, backend, r["seed"]) in fedavg_worst
        ]
        out.append(
            {
                "federation": fed,
                "backend": backend,
                "method": method,
                "seeds": sorted(r["seed"] for r in mine),
                "n_clusters": [r["n_clusters"] for r in sorted(mine, key=lambda r: r["seed"])],
                "noise_clusters": [r.get("noise_clusters") for r in sorted(mine, key=lambda r: r["seed"])],
                **{
                    k: _mean([r.get(k) for r in mine])
                    for k in ("ari", "avg_acc", "worst_acc", "margin", "gap", "command_wall_s")
                },
                "worst_minus_fedavg": _mean(gaps),
            }
        )
    return out


def grid_estimate(rows: list[dict], names: list[str]) -> tuple[int, float]:
    """(jobs, seconds) of the full grid (every method, seeds 0-2, the simulator) from the walls
    measured: a method not measured on a federation counts at that federation's mean, one
    never measured anywhere at the largest federation mean."""
    walls = [r["command_wall_s"] for r in rows if r["command_wall_s"] is not None]
    fallback = max(walls) if walls else 60.0
    jobs, seconds = 0, 0.0
    for name in names:
        fed = FEDERATIONS[name]
        mine = [r for r in rows if r["federation"] == name and r["command_wall_s"] is not None]
        fed_mean = _mean([r["command_wall_s"] for r in mine]) or fallback
        for method in methods_for(fed, list(METHODS)):
            wall = _mean([r["command_wall_s"] for r in mine if r["method"] == method]) or fed_mean
            jobs, seconds = jobs + 3, seconds + 3 * wall
    return jobs, seconds


def _fmt(value: float | None, scale: float = 100, digits: int = 1) -> str:
    return "-" if value is None else f"{scale * value:.{digits}f}"


def _clusters(r: dict) -> str:
    """Clusters per seed, `k←m` where EMD-CFL's clear gap kept k of the noise cut's m."""
    finer = r.get("noise_clusters") or [None] * len(r["n_clusters"])
    return ",".join(f"{k}←{m}" if m is not None else str(k) for k, m in zip(r["n_clusters"], finer))


def markdown(
    table: list[dict], commands: str, estimate: tuple[int, float], built: dict[str, dict], tree: str, title: str
) -> str:
    lines = [
        f"# Federations nobody tuned for: {title}",
        "",
        "```bash",
        *dict.fromkeys(commands.strip().splitlines()),  # each command once, in the order first given
        "```",
        "",
        f"Jobs of {tree}; data built by `benchmarks/federation_data.py`. Accuracy in %, the mean over the seeds run; "
        "worst − FedAvg: the worst site's accuracy less FedAvg's in the same seeds (points); clusters: per seed; "
        "margin: EMD-CFL's smallest between-cluster over its largest within-cluster distance (both in noise units; the "
        "mean over the seeds that found more than one cluster; below 1 the cut parts sites closer than some it joins); "
        "k←m: EMD-CFL's clear gap kept k clusters of the m its noise cut gave; gap: how many times higher the clusters "
        "kept join than their members did (the mean over the seeds that kept more than one).",
        "",
        "| federation | sites (examples) | groups | partitioner |",
        "|---|---|---|---|",
    ]
    for name, meta in built.items():
        sizes = [s["examples"] for s in meta["sites"]]
        fed = meta["federation"]
        lines.append(
            f"| `{name}`: {fed['what']} | {len(sizes)} ({min(sizes)}-{max(sizes)}) | "
            f"{len(fed['shifts']) if len(fed['shifts']) > 1 else 'none'} | {meta['partitioner']} |"
        )
    lines += [
        "",
        "| federation | backend | method | seeds | clusters | ARI | avg acc | worst acc | worst − FedAvg | margin "
        "| gap | s a job |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['federation']} | {r['backend']} | {r['method']} | {','.join(map(str, r['seeds']))} | "
            f"{_clusters(r)} | {_fmt(r['ari'], 1, 2)} | {_fmt(r['avg_acc'])} | "
            f"{_fmt(r['worst_acc'])} | {_fmt(r['worst_minus_fedavg'])} | {_fmt(r['margin'], 1, 2)} | "
            f"{_fmt(r.get('gap'), 1, 1)} | {_fmt(r['command_wall_s'], 1, 0)} |"
        )
    lines += ["", *at_a_glance(table)]
    jobs, seconds = estimate
    lines += [
        "",
        f"The full grid (every method, seeds 0-2, the simulator): {jobs} jobs, about {seconds / 60:.0f} min "
        "on this machine.",
        "",
    ]
    return "\n".join(lines)


def at_a_glance(table: list[dict]) -> list[str]:
    """Each method's worst-site accuracy beside FedAvg's, a federation a row (the simulator), with
    the ARI where the sites have true groups and the clusters elsewhere: which method to choose
    for which kind of federation is read off this."""
    sim = [r for r in table if r["backend"] == "simulate"]
    feds = [f for f in FEDERATIONS if any(r["federation"] == f for r in sim)]
    methods = [m for m in METHODS if any(r["method"] == m for r in sim)]
    lines = [
        "At a glance (the simulator): FedAvg's worst-site accuracy (%), each other method's less FedAvg's in the same "
        "seeds (points); then the ARI where the sites have true groups, else the clusters per seed; how many seeds ran "
        "in brackets.",
        "",
        "| federation | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for fed in feds:
        cells = []
        for method in methods:
            r = next((r for r in sim if (r["federation"], r["method"]) == (fed, method)), None)
            if r is None:
                cells.append("")
                continue
            found = f"ARI {_fmt(r['ari'], 1, 2)}" if FEDERATIONS[fed].grouped else f"{_clusters(r)} cl"
            worst = (
                f"{_fmt(r['worst_acc'])} %"
                if method == "fedavg" or r["worst_minus_fedavg"] is None
                else f"{100 * r['worst_minus_fedavg']:+.1f}"
            )
            cells.append(f"{worst} · {found} ({len(r['seeds'])})")
        lines.append(f"| {fed} | " + " | ".join(cells) + " |")
    return lines


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = [r for r in table if r["backend"] == "simulate"]
    feds = [f for f in FEDERATIONS if any(r["federation"] == f for r in sim)]
    methods = [m for m in METHODS if any(r["method"] == m for r in sim)]
    fig, axes = plt.subplots(3, 1, figsize=(max(8, 1.1 * len(feds)), 10), sharex=True)
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        by_fed = {r["federation"]: r for r in sim if r["method"] == method}
        xs = np.arange(len(feds)) + (j - (len(methods) - 1) / 2) * width
        for ax, key, scale in ((axes[0], "worst_acc", 100), (axes[1], "ari", 1)):
            ys = [by_fed[f][key] if f in by_fed and by_fed[f][key] is not None else np.nan for f in feds]
            bars = ax.bar(xs, np.array(ys, dtype=float) * scale, width, label=method)
            if key == "ari":  # an ARI of 0 is no bar: say it
                ax.bar_label(bars, ["" if np.isnan(y) else f"{y:.2f}" for y in ys], fontsize=6)
        ys = [np.mean(by_fed[f]["n_clusters"]) if f in by_fed else np.nan for f in feds]
        axes[2].bar(xs, ys, width, label=method)
    axes[0].set_ylabel("worst site accuracy (%)")
    axes[1].set_ylabel("ARI (grouped federations)")
    axes[2].set_ylabel("clusters found (mean)")
    truth = [len(FEDERATIONS[f].shifts) for f in feds]
    marks = axes[2].scatter(
        np.arange(len(feds)), truth, marker="_", s=600, color="black", label="true groups (1: none)"
    )
    axes[2].set_xticks(np.arange(len(feds)), feds, rotation=30, ha="right")
    axes[0].legend(ncol=len(methods) + 1, fontsize=8)
    axes[2].legend(handles=[marks], fontsize=8)
    fig.suptitle("The product's defaults on federations nobody tuned for (mean over seeds, simulator)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args: argparse.Namespace, names: list[str], command: str) -> None:
    """The table, JSON and plot of every finished run of `names`, headed by the commands that ran
    them and `command`, this one."""
    rows = collect(args.out, names)
    table = aggregate(rows)
    estimate = grid_estimate(rows, names)
    built = {
        n: json.loads((args.out / "data" / n / "federation.json").read_text())
        for n in names
        if (args.out / "data" / n / "federation.json").is_file()
    }
    ran = (args.out / "commands.txt").read_text() if (args.out / "commands.txt").is_file() else ""
    commands = f"{ran}{command}\n"
    stem = args.results / f"{date.today():%Y%m%d}-federations"
    args.results.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown(table, commands, estimate, built, tree_label(args.tree), args.title))
    stem.with_suffix(".json").write_text(
        json.dumps({"runs": rows, "table": table, "federations": built}, indent=1) + "\n"
    )
    if table:
        plot(table, stem.with_suffix(".png"))
    print(f"full grid: {estimate[0]} jobs, about {estimate[1] / 60:.0f} min; report {stem}.md, .json, .png", flush=True)


def tree_label(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"the tree {tree} at {head.stdout.strip()}" if head.returncode == 0 else f"the tree {tree}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.federations.split(",")
    command = f"python -m benchmarks.federations {shlex.join(argv if argv is not None else sys.argv[1:])}"
    if args.list:
        for name in names:
            fed = FEDERATIONS[name]
            print(f"{name:22s} {fed.sites:2d} sites  {fed.source:13s} {fed.what}")
        jobs, seconds = grid_estimate(collect(args.out, names), names)
        print(f"full grid: {jobs} jobs, about {seconds / 60:.0f} min from the walls measured in {args.out}")
        return 0
    if not args.report_only:
        if args.partitioner == "flwr" and not flwr_available():
            print(f"benchmarks.federations: {FLWR_MISSING}", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "commands.txt", "a") as log:
            log.write(f"{command}\n")
        for name in names:
            ensure_built(FEDERATIONS[name], args.out / "data" / name, args.mnist, args.partitioner)
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in names:
                for method in methods_for(FEDERATIONS[name], args.methods.split(",")):
                    run_one(FEDERATIONS[name], method, seed, args)
    report(args, names, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
