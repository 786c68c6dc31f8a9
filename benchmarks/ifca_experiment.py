"""IFCA's rotated-MNIST experiment to convergence: EMD-CFL, IFCA, FedAvg and the Oracle side by
side on configs/ifca_rotated_mnist.yaml (the same data, partition and seed).

    python -m benchmarks.ifca_experiment --mnist DIR [--config YAML] [--silos 400] [--rounds 300]
        [--silo-ranks 2] [--methods emdcfl,ifca,fedavg,oracle] [--seed 0] [--out DIR] [--resume]
        [--stop-after-round N] [--report-only] [--set KEY=VALUE ...]

Each method is its own MPI job (`python -m cfl_mpi.experiments.compare`, on 1 + `silo-ranks` ranks); IFCA
starts from random cluster models as its authors' code does (`strategy.init: random`), the
others as the config says. `--stop-after-round N` runs each method to round N of its
`--rounds` and stops it there with its checkpoint (`runtime.stop_after_round`, not part of the
experiment): the same command with a larger N and `--resume` continues every method from where
it stopped, so that 300 rounds can be run in pieces that each fit a machine's time. Writes in
the output folder, besides compare's tables and runs:
`accuracy.png`, the average silo accuracy per round and against the server's wall time (the
rounds' own seconds, summed), one line per method; and `experiment.md`, the table of the last
round's average and worst accuracy, ARI in round 1 and at the end, rounds to 90 % of the last
round's accuracy and the rounds' wall time, then each method's accuracy at the same rounds.
`--report-only` redraws both from the runs as far as they got.

Two test accuracies: the runtime's, each silo's test images under its own cluster's model,
averaged over silos; and IFCA's (its code's `get_inference_stats`): the held-out test pool in
its order, a copy per rotation cut into test clients of 100 images, each client taking the
final model of lowest loss on its images, correct answers over all test images.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from .runs import ROOT, machine

CONFIG = "configs/ifca_rotated_mnist.yaml"
METHODS = ("emdcfl", "ifca", "fedavg", "oracle")
LABELS = {"emdcfl": "EMD-CFL", "ifca": "IFCA", "fedavg": "FedAvg", "oracle": "Oracle"}


def run_methods(args: argparse.Namespace, out: Path) -> int:
    """compare's jobs, one per method, on the experiment's settings; compare's exit code (1 if
    a run failed: the others are reported all the same)."""
    sets = [
        f"silos={args.silos}",
        f"train.rounds={args.rounds}",
        f"runtime.silos_per_rank={math.ceil(args.silos / args.silo_ranks)}",
        f"data.root={args.mnist}",
        "data.download=false",
        *(["ifca:strategy.init=random"] if "ifca" in args.methods else []),
        *([f"runtime.stop_after_round={args.stop_after_round}"] if args.stop_after_round else []),
        *args.overrides,
    ]
    command = [
        sys.executable,
        "-m",
        "cfl_mpi.experiments.compare",
        args.config,
        "--methods",
        ",".join(args.methods),
        "--seeds",
        str(args.seed),
        "--out",
        str(out),
        *(a for s in sets for a in ("--set", s)),
    ]
    return subprocess.run(command + (["--resume"] if args.resume else []), cwd=ROOT).returncode


def ifca_test_accuracy(run: Path, clients_of: int = 100) -> float:
    """IFCA's test accuracy of a finished run's final models (see the module's docstring)."""
    import torch

    from cfl_mpi.config import load_config
    from cfl_mpi.data.images import to_model_input
    from cfl_mpi.models.build import build_model, load_arrays
    from cfl_mpi.runtime.checkpoint import load_checkpoint

    cfg = load_config(run / "config.yaml")
    data = cfg.data
    _, _, x_test, y_test = data.pools(cfg.seed)
    mean, std = data.normalisation(imagenet=False)
    models = []
    for arrays in load_checkpoint(run).models:
        model = build_model(cfg.architecture, load_weights=False)
        load_arrays(model, arrays)
        models.append(model.eval())
    correct, y = 0, torch.from_numpy(np.array(y_test))
    with torch.no_grad():
        for group in range(data.group_count()):
            x = torch.from_numpy(to_model_input(data.look(group, x_test, y_test), mean, std))
            for start in range(0, len(y) - clients_of + 1, clients_of):
                xs, ys = x[start : start + clients_of], y[start : start + clients_of]
                logits = [model(xs) for model in models]
                losses = [float(torch.nn.functional.cross_entropy(z, ys)) for z in logits]
                correct += int((logits[int(np.argmin(losses))].argmax(1) == ys).sum())
    return correct / (data.group_count() * (len(y_test) // clients_of) * clients_of)


def read_run(run: Path) -> list[dict]:
    """The run's rounds so far (finished or stopped after a round)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def accuracy_by_round(runs: dict[str, list[dict]]) -> str:
    """Each method's average accuracy at the same rounds, up to the last round every run reached."""
    last = min(len(records) for records in runs.values())
    shown = sorted({r for r in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300) if r <= last} | {last})
    rows = [
        "| method | " + " | ".join(f"round {r}" for r in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for method, records in runs.items():
        cells = " | ".join(f"{100 * records[r - 1]['avg_acc']:.2f} %" for r in shown)
        rows.append(f"| {LABELS.get(method, method)} | {cells} |")
    return "\n".join(rows)


def rounds_to(share: float, accuracies: list[float]) -> int:
    """The first round whose average accuracy reaches `share` of the final one."""
    return next(i + 1 for i, a in enumerate(accuracies) if a >= share * accuracies[-1])


def report(out: Path, methods: list[str], seed: int) -> str:
    """experiment.md's table and accuracy.png from the finished runs."""
    from cfl_mpi.reporting.plots import MARKERS, OKABE_ITO, _pyplot, _round_axis, coinciding

    plt = _pyplot()
    runs = {m: read_run(out / f"{m}_s{seed}") for m in methods if (out / f"{m}_s{seed}" / "metrics.jsonl").exists()}
    same = coinciding(
        {m: ([r["round"] for r in records], np.array([r["avg_acc"] for r in records])) for m, records in runs.items()}
    )
    fig, (by_round, by_wall) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    rows = [
        "| method | rounds | average accuracy | IFCA's test accuracy | worst accuracy | ARI round 1 | "
        "ARI last | rounds to 90 % of last | wall of the rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, method in enumerate(methods):
        if method not in runs:
            rows.append(f"| {LABELS.get(method, method)} | not run | | | | | | | |")
            continue
        records = runs[method]
        label = LABELS.get(method, method) + (
            f" (same as {LABELS.get(same[method], same[method])})" if method in same else ""
        )
        rounds = [r["round"] for r in records]
        accuracy = [100 * r["avg_acc"] for r in records]
        wall = np.cumsum([sum(r["seconds"].values()) for r in records]) / 60
        style = dict(
            color=OKABE_ITO[i % len(OKABE_ITO)],
            marker=MARKERS[i % len(MARKERS)],
            lw=1.6,
            ms=6,
            mec="black",
            mew=0.5,
            markevery=max(1, len(rounds) // 15),
            label=label,
        )
        by_round.plot(rounds, accuracy, **style)
        by_wall.plot(wall, accuracy, **style)
        rows.append(
            f"| {LABELS.get(method, method)} | {rounds[-1]} | {accuracy[-1]:.2f} % | "
            f"{100 * ifca_test_accuracy(out / f'{method}_s{seed}'):.2f} % | {100 * records[-1]['worst_acc']:.2f} % | "
            f"{records[0]['ari']:.3f} | {records[-1]['ari']:.3f} | {rounds_to(0.9, accuracy)} | "
            f"{wall[-1]:.1f} min |"
        )
    _round_axis(by_round, {r["round"] for records in runs.values() for r in records})
    for ax, label in ((by_round, "round"), (by_wall, "the server's wall time in rounds (minutes)")):
        ax.set_xlabel(label)
        ax.set_ylabel("average silo test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"IFCA's rotated MNIST, {out.name}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)
    table = "\n".join(rows)
    return f"{table}\n\nAverage silo test accuracy by round:\n\n{accuracy_by_round(runs)}" if runs else table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, help="folder of MNIST's files (the config's data.pool says which)")
    parser.add_argument("--config", default=CONFIG, help=f"the experiment's config (default {CONFIG})")
    parser.add_argument("--silos", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--silo-ranks", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--resume", action="store_true", help="skip the methods whose run has finished, continue the stopped ones"
    )
    parser.add_argument(
        "--stop-after-round", type=int, metavar="N", help="run each method to round N (to be continued with --resume)"
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="[METHOD:]KEY=VALUE")
    args = parser.parse_args(argv)
    args.methods = args.methods.split(",")
    out = (args.out or Path(f"runs/ifca_experiment_c{args.silos}_t{args.rounds}")).resolve()
    code = 0
    if not args.report_only:
        if args.mnist is None:
            parser.error("--mnist DIR is needed to run the jobs")
        args.mnist = args.mnist.resolve()
        code = run_methods(args, out)
    table = report(out, args.methods, args.seed)
    text = (
        f"# IFCA's rotated MNIST: C = {args.silos} on {args.silo_ranks} silo ranks, {args.rounds} rounds, "
        f"seed {args.seed}\n\n{machine()}\n\n{table}\n\n![accuracy](accuracy.png)\n"
    )
    (out / "experiment.md").write_text(text)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
