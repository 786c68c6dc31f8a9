"""Silos that read their own files against the built-in data set they were exported from, side
by side in one run: the same results bit for bit, each silo rank's peak memory over the bytes
of its own silos' data, and how fast a bad silo file ends a job.

    python -m benchmarks.silo_files [--silos 16] [--ranks 5] [--repeats 2]

The built-in federation is rotated MNIST (configs/rotated.yaml: the training split, $CFL_MPI_MNIST
or data/mnist), `--silos` silos on `--ranks` ranks (a block of silos a rank), one round of one
epoch; its export (`python -m cfl_mpi.commands.export`) runs with the same ranks. Peak memory is the
peak PSS of each rank (shared pages counted once), sampled every half second; a silo rank's
data bytes are those of its silos' arrays (`SiloData`). The bad file: the digits quick start
exported, one silo's labels beyond the classes, under `mpirun -n 9`: seconds from launch to
the exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cfl_mpi.channel import RankLayout
from cfl_mpi.commands.export import export
from cfl_mpi.config import load_config

from .runs import DIGITS, MNIST, ROOT, mpirun, run_job

ROTATED = ("configs/rotated.yaml", (f"data.root={MNIST}", "data.download=false"))
JOB = ("train.rounds=1", "train.local_epochs=1", "model.channels=[16,32]", "strategy.pair_keys=seeded")


def data_bytes(cfg, ranks: int) -> dict[int, int]:
    """Bytes of each silo rank's silos' arrays."""
    layout = RankLayout(cfg.silos, ranks - 1)
    facts = cfg.data_facts()
    out = {}
    for rank in range(1, ranks):
        total = 0
        for silo in layout.silos_on(rank):
            data = cfg.data.build(silo, facts)
            total += sum(a.nbytes for a in vars(data).values() if isinstance(a, np.ndarray))
        out[rank] = total
    return out


def bad_file_seconds(folder: Path, repeats: int) -> list[float]:
    """Seconds to exit 2 under mpirun -n 9 with silo 5's labels beyond the classes."""
    cfg = load_config(ROOT / DIGITS[0], [*JOB])
    config = export(cfg, folder)
    bad = np.load(folder / "silo_0005.npz")
    arrays = {k: bad[k] for k in bad.files}
    arrays["y_train"] = arrays["y_train"] + 10
    np.savez(folder / "silo_0005.npz", **arrays)
    seconds = []
    for _ in range(repeats):
        start = time.monotonic()
        done = subprocess.run(
            [mpirun(), "-n", "9", sys.executable, "-m", "cfl_mpi.main", str(config), "--out", str(folder / "run")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={
                "PYTHONPATH": str(ROOT),
                "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
                "OMP_NUM_THREADS": "1",
            },
        )
        seconds.append(time.monotonic() - start)
        assert done.returncode == 2, done.stderr[-2000:]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silos", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    overrides = [*ROTATED[1], f"silos={args.silos}", *JOB]
    cfg = load_config(ROOT / ROTATED[0], overrides)
    with tempfile.TemporaryDirectory(prefix="cfl_files_") as tmp:
        exported = export(cfg, Path(tmp) / "files")
        files_cfg = load_config(exported)
        from cfl_mpi.runtime.agreement import agreed_in_process

        sizes = data_bytes(cfg, args.ranks)
        file_sizes = data_bytes(agreed_in_process(files_cfg), args.ranks)
        assert sizes == file_sizes
        peaks: dict[str, list[dict[int, float]]] = {"built-in": [], "files": []}
        results = {}
        for _ in range(args.repeats):  # interleaved: the machine's drift hits both alike
            for name, (config, sets) in (("built-in", (ROTATED[0], overrides)), ("files", (str(exported), []))):
                job = run_job(ROOT, config, list(sets), args.ranks)
                peaks[name].append(job.pss_mb)
                results[name] = (job.records[-1]["clusters"], job.records[-1]["accuracy"])
        same = results["built-in"] == results["files"]
        bad = bad_file_seconds(Path(tmp) / "bad", 3)
    print(f"rotated MNIST, {args.silos} silos on {args.ranks - 1} silo ranks, {args.repeats} interleaved runs each")
    print(f"same clusters and per-silo accuracies: {same}")
    print(
        "| rank | its silos' data (MB) | built-in peak PSS (MB) | files peak PSS (MB) "
        "| built-in / data | files / data |"
    )
    print("|---|---|---|---|---|---|")
    ratios = {"built-in": [], "files": []}
    for rank in range(1, args.ranks):
        mb = sizes[rank] / 2**20
        row = {name: statistics.median(p[rank] for p in peaks[name]) for name in peaks}
        for name in row:
            ratios[name].append(row[name] / mb)
        print(
            f"| {rank} | {mb:.1f} | {row['built-in']:.0f} | {row['files']:.0f} | {row['built-in'] / mb:.2f} | "
            f"{row['files'] / mb:.2f} |"
        )
    server = {name: statistics.median(p[0] for p in peaks[name]) for name in peaks}
    print(f"server peak PSS: built-in {server['built-in']:.0f} MB, files {server['files']:.0f} MB")
    print(
        f"median silo rank, peak PSS over data: built-in {statistics.median(ratios['built-in']):.2f}, "
        f"files {statistics.median(ratios['files']):.2f}"
    )
    print(
        f"a bad silo file under mpirun -n 9: exit 2 after {', '.join(f'{s:.1f}' for s in bad)} s "
        f"(median {statistics.median(bad):.1f} s)"
    )
    print(json.dumps({"peaks": peaks, "bytes": sizes, "bad_s": bad}))


if __name__ == "__main__":
    main()
