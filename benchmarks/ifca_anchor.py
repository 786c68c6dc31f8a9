"""IFCA's own code beside ours, on IFCA's rotated-MNIST experiment: the same data, machine and
settings, seconds per round by phase, peak memory, accuracy and cluster agreement after the
same rounds, as ratios ours / theirs.

    python -m benchmarks.ifca_anchor --ifca PATH --mnist DIR [--rounds 3] [--repeats 3]
        [--silo-ranks 2] [--emdcfl] [--simulator] [--out DIR]

PATH is a checkout of IFCA's code (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020:
github.com/jichan3751/ifca), run unmodified: its `mnist/train_cluster_mnist.py` with its own
`mnist/config.json` (m = 2,400 clients of n = 100 training images, 4 rotations, MLP 784-200-10,
tau = 10 full-batch steps of lr 0.1), `num_epochs` set to --rounds. It runs in a scratch folder
holding a copy of that config and, in `data/MNIST/raw`, the MNIST files of DIR unpacked (so
torchvision finds them and downloads nothing). Ours is `configs/ifca_rotated_mnist.yaml` (the
same data recipe: each rotation a permutation of the training images in 600 silos of 100,
tests from the test split, raw pixels) with `strategy.name=ifca` and `strategy.init=random`
(IFCA's code starts from random models), under `mpirun -n 1+silo-ranks`; with --emdcfl also the
config's EMD-CFL, whose rounds after the first (its clusters fixed by round 1) are set beside
IFCA's rounds.

Per round, theirs: training (`sec(train)` of its log), the identity step (its inference over
every training client under every model, which picks next round's clusters) and the test (its
test clients under every model). Ours: the server's phases (train, aggregation, evaluation) and
the identity step, from the K models' broadcast to the last silo's losses, which overlaps
training (a silo that has sent its losses trains meanwhile). Memory: theirs the peak PSS of its
process; ours the peak of the ranks' PSS summed at one moment (what the machine holds at once).
With --simulator also our IFCA in the simulator: one process, as theirs. Accuracy: both on
IFCA's own test (100-image test clients taking the model of lowest loss;
`ifca_experiment.ifca_test_accuracy` for ours), ours also per silo; cluster agreement: the ARI
of the final round's clusters against the rotations. Medians over --repeats runs, theirs and
ours interleaved. Writes `anchor.md` (the table, the machine, the anchor's commit and every
command) in --out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from cfl_mpi.clustering.labels import adjusted_rand_index

from .ifca_experiment import ifca_test_accuracy
from .runs import ROOT, machine, run_job, run_watched

CONFIG = "configs/ifca_rotated_mnist.yaml"
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# "Epoch 0 tr: l 0.321 a 0.912 clct[600, 600, 600, 600] lr 0.100000 15.2sec(train) 2.6sec(infer)"
TRAIN_LINE = re.compile(r"^Epoch (\d+) tr: l \S+ a \S+ clct.* ([\d.]+)sec\(train\) ([\d.]+)sec\(infer\)")
TEST_LINE = re.compile(r"^Epoch (\d+) tst: l \S+ a ([\d.]+) clct.* ([\d.]+)sec$")


def anchor_commit(ifca: Path) -> str:
    found = subprocess.run(["git", "-C", str(ifca), "rev-parse", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def run_theirs(ifca: Path, mnist: Path, rounds: int, scratch: Path) -> tuple[dict, str]:
    """IFCA's script, unmodified, in `scratch`; its per-round phases, accuracy, ARI and memory."""
    work = scratch / "theirs"
    raw = work / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:  # torchvision reads the files unpacked, and downloads what it lacks
        if (mnist / name).exists():
            (raw / name).symlink_to((mnist / name).resolve())
        elif (mnist / f"{name}.gz").exists():
            with gzip.open(mnist / f"{name}.gz") as packed, open(raw / name, "wb") as unpacked:
                shutil.copyfileobj(packed, unpacked)
        else:
            raise SystemExit(f"{name}[.gz] not found in {mnist}")
    shutil.copy(ifca / "mnist" / "config.json", work / "config.json")
    override = json.dumps({"num_epochs": rounds})
    command = [sys.executable, str(ifca / "mnist" / "train_cluster_mnist.py"), "--project-dir", "output",
               "--config-override", override]  # fmt: skip
    log, wall, peak_mb = run_watched(command, work)
    train, test = {}, {}
    for line in log.splitlines():
        if m := TRAIN_LINE.match(line):
            train[int(m[1])] = (float(m[2]), float(m[3]))
        elif m := TEST_LINE.match(line):
            test[int(m[1])] = (float(m[2]), float(m[3]))
    epochs = sorted(train)
    if epochs != list(range(rounds)):
        raise RuntimeError(f"IFCA's log has training lines for epochs {epochs}, not 0..{rounds - 1}:\n{log[-2000:]}")
    with open(work / "output" / "results.pickle", "rb") as fh:  # written by the script just run
        results = pickle.load(fh)
    config = json.loads((work / "config.json").read_text())
    truth = np.repeat(np.arange(config["p"]), config["m"] // config["p"])  # its clients are rotation-major
    per_round = [
        {"train": train[e][0], "identity": train[e][1], "test": test[e][1], "round": sum(train[e]) + test[e][1]}
        for e in epochs
    ]
    return {
        "wall_s": wall,
        "pss_mb": peak_mb,
        "rounds": per_round,
        "ifca_acc": test[epochs[-1]][0],
        "ari": adjusted_rand_index(truth, np.array(results[-1]["train"]["cluster_assign"])),
    }, " ".join(command) + "   (in a scratch folder with its config.json and MNIST under data/MNIST/raw)"


def run_ours(
    mnist: Path, rounds: int, silo_ranks: int, scratch: Path, repeat: int, strategy: str = "ifca"
) -> tuple[dict, str]:
    """Our IFCA (or the config's EMD-CFL) on the same experiment under mpirun (silo_ranks 0: in
    the simulator, one process as IFCA's script); its per-round phases, accuracies, ARI and
    memory (the peak of the ranks' PSS summed at one moment)."""
    silos = 2400
    method = ["strategy.name=ifca", "strategy.init=random"] if strategy == "ifca" else []
    sets = [f"data.root={mnist}", "data.download=false", f"train.rounds={rounds}", *method]
    out = scratch / f"ours_{strategy}_{silo_ranks}_{repeat}"
    if silo_ranks:
        sets.append(f"runtime.silos_per_rank={math.ceil(silos / silo_ranks)}")
        job = run_job(ROOT, CONFIG, sets, 1 + silo_ranks, keep=out)
        records, wall_s, pss_mb = job.records, job.wall_s, job.tree_pss_mb
        command = f"mpirun -n {1 + silo_ranks} python -m cfl_mpi.main {CONFIG} "
    else:
        overrides = [a for s in sets for a in ("--set", s)]
        cmd = [sys.executable, "-m", "cfl_mpi.backends.simulate", CONFIG, "--out", str(out), *overrides]
        _, wall_s, pss_mb = run_watched(cmd, ROOT, {**os.environ, "PYTHONPATH": str(ROOT)})
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        command = f"python -m cfl_mpi.backends.simulate {CONFIG} "
    per_round = [
        {
            "train": r["seconds"].get("train", 0.0),
            # from the K models' broadcast to the last silo's losses: the silos that have theirs
            # train meanwhile, so it overlaps training (an older record: the clustering phase)
            "identity": r.get("server_steps", {}).get("identity", r["seconds"].get("clustering", 0.0)),
            "test": r["seconds"].get("evaluation", 0.0),
            "aggregation": r["seconds"].get("aggregation", 0.0),
            "round": sum(r["seconds"].values()),
        }
        for r in records
    ]
    return {
        "wall_s": wall_s,
        "pss_mb": pss_mb,
        "rounds": per_round,
        "ifca_acc": ifca_test_accuracy(out),
        "silo_acc": records[-1]["avg_acc"],
        "ari": records[-1]["ari"],
        "ari_first": records[0]["ari"],
    }, command + " ".join(f"--set {s}" for s in sets)


def median_round(runs: list[dict], key: str) -> float:
    """Median over runs of the median round's `key` seconds (round 1 apart: `first_round`)."""
    return statistics.median(statistics.median(r[key] for r in run["rounds"][1:] or run["rounds"]) for run in runs)


IFCA_PHASES = (("round", "a round after the first"), ("train", "training"), ("identity", "identity step"),
               ("test", "test / evaluation"))  # fmt: skip
# EMD-CFL's clusters are fixed after its first round: a round after it has no identity step
EMDCFL_PHASES = (("round", "a round after the first"), ("train", "training"), ("test", "test / evaluation"))


def table(theirs: list[dict], ours: list[dict], name: str = "cfl_mpi", phases=IFCA_PHASES, first="round 1") -> str:
    """Medians side by side, ours / theirs: seconds per round by phase, round 1, the whole
    command, memory, IFCA's test accuracy and the clusters' ARI."""
    rows = [f"| | IFCA's code | {name} | ours / theirs |", "|---|---|---|---|"]

    def row(what: str, a: float, b: float, unit: str) -> None:
        rows.append(f"| {what} | {a:.2f} {unit} | {b:.2f} {unit} | {b / a:.2f}× |")

    for key, what in phases:
        row(what, median_round(theirs, key), median_round(ours, key), "s")
    firsts = [statistics.median(run["rounds"][0]["round"] for run in runs) for runs in (theirs, ours)]
    row(first, firsts[0], firsts[1], "s")
    row("whole command", *(statistics.median(r["wall_s"] for r in runs) for runs in (theirs, ours)), "s")
    row("peak memory (PSS)", *(statistics.median(r["pss_mb"] / 1024 for r in runs) for runs in (theirs, ours)), "GB")
    acc = [statistics.median(100 * r["ifca_acc"] for r in runs) for runs in (theirs, ours)]
    rows.append(f"| IFCA's test accuracy | {acc[0]:.2f} % | {acc[1]:.2f} % | {acc[1] - acc[0]:+.2f} points |")
    silo = statistics.median(100 * r["silo_acc"] for r in ours)
    rows.append(f"| per-silo test accuracy | – | {silo:.2f} % | |")
    ari = [statistics.median(r["ari"] for r in runs) for runs in (theirs, ours)]
    rows.append(f"| ARI of the last round's clusters | {ari[0]:.3f} | {ari[1]:.3f} | |")
    rows.append(f"| ARI after round 1 | – | {statistics.median(r['ari_first'] for r in ours):.3f} | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ifca", type=Path, required=True, help="a checkout of github.com/jichan3751/ifca")
    parser.add_argument("--mnist", type=Path, required=True, help="folder of MNIST's four files (.gz or not)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--silo-ranks", type=int, default=2)
    parser.add_argument("--emdcfl", action="store_true", help="also run our EMD-CFL (its clustering round is minutes)")
    parser.add_argument(
        "--simulator", action="store_true", help="also run our IFCA in the simulator (one process, as IFCA's script)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/ifca_anchor"))
    args = parser.parse_args(argv)
    script = args.ifca / "mnist" / "train_cluster_mnist.py"
    if not script.is_file():
        parser.error(f"--ifca: {script} not found (a checkout of github.com/jichan3751/ifca)")
    args.out.mkdir(parents=True, exist_ok=True)
    theirs: list[dict] = []
    ours: list[dict] = []
    emdcfl: list[dict] = []
    simulated: list[dict] = []
    commands: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ifca_anchor_") as tmp:
        for repeat in range(args.repeats):  # interleaved: a drift of the machine hits both
            scratch = Path(tmp) / str(repeat)
            scratch.mkdir()
            result, theirs_command = run_theirs(args.ifca.resolve(), args.mnist.resolve(), args.rounds, scratch)
            theirs.append(result)
            result, ours_command = run_ours(args.mnist.resolve(), args.rounds, args.silo_ranks, scratch, repeat)
            ours.append(result)
            commands = [theirs_command, ours_command]
            if args.emdcfl:
                result, emdcfl_command = run_ours(
                    args.mnist.resolve(), args.rounds, args.silo_ranks, scratch, repeat, "emdcfl"
                )
                emdcfl.append(result)
                commands.append(emdcfl_command)
            if args.simulator:
                result, simulator_command = run_ours(args.mnist.resolve(), args.rounds, 0, scratch, repeat)
                simulated.append(result)
                commands.append(simulator_command)
            walls = ", ".join(f"{r[-1]['wall_s']:.1f} s" for r in (ours, emdcfl, simulated) if r)
            print(f"repeat {repeat + 1}/{args.repeats}: theirs {theirs[-1]['wall_s']:.1f} s, ours {walls}", flush=True)
    text = (
        f"# IFCA's own code beside cfl_mpi: IFCA's rotated MNIST, m = 2,400, {args.rounds} rounds, "
        f"medians of {args.repeats} interleaved runs\n\n{machine()}\n\n"
        f"Anchor: github.com/jichan3751/ifca at {anchor_commit(args.ifca)}, run unmodified.\n\n"
        f"{table(theirs, ours)}\n\n"
        + (
            "EMD-CFL (the config's own strategy) on the same experiment:\n\n"
            + table(theirs, emdcfl, "cfl_mpi's EMD-CFL", EMDCFL_PHASES, "round 1 (EMD-CFL's clustering)")
            + "\n\n"
            if emdcfl
            else ""
        )
        + (
            "Our IFCA in the simulator (one process, as IFCA's script):\n\n"
            + table(theirs, simulated, "cfl_mpi's simulator")
            + "\n\n"
            if simulated
            else ""
        )
        + f"Commands (`python -m benchmarks.ifca_anchor {' '.join(argv or sys.argv[1:])}`):\n\n"
        + "\n".join(f"    {c}" for c in commands)
        + "\n\nRaw figures: `anchor.json`.\n"
    )
    raw = {"theirs": theirs, "ours": ours, "emdcfl": emdcfl, "simulator": simulated}
    (args.out / "anchor.json").write_text(json.dumps(raw, indent=1))
    (args.out / "anchor.md").write_text(text)
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
