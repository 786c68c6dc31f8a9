"""Start-up of a wide job: 41 ranks (server + 40 silos) to the first round, against the floor
of 41 Python processes importing torch (and initialising CUDA, where there is a GPU) on this
machine's cores, with each rank's timeline of what it did before its first round.

    python -m benchmarks.startup [--ranks 41] [--config YAML] [--set KEY=VALUE ...] [--repeats N]

The job's start-up is its wall minus the server's own run (`summary.json` wall_s): launching,
imports, data and model building on every rank, the placement and the hello, and also what
follows the last round: the results folder (plots) and the ranks' exit. Both parts are shown:
"to the first round" ends where the server's run starts (summary.json's time less wall_s),
"after the last round" begins where summary.json is written. The floor runs the same number
of `python -c "import torch"` processes (each starts, imports and exits), as many at a time
as there are cores.

The timeline (cfl_mpi/runtime/timeline.py, written by every rank with CFL_MPI_TIMELINE set)
gives each step's seconds, median and slowest over the silo ranks, and the server's: from the
launch to the process's start, the Python and cfl_mpi imports, MPI's initialisation, the
config's checks, the placement, torch's import, the device (CUDA's initialisation), then per
silo its data, its model and sets on the device, its strategy half (with the modules it
calls into), and the wait for the server's hello.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .runs import DIGITS, ROOT, run_job

JOB = ("silos={silos}", "train.rounds=1", "train.local_epochs=1", "model.channels=[16,32]", "strategy.name=fedavg")


def floor_seconds(ranks: int, code: str) -> float:
    """Wall seconds of `ranks` processes running `code`, as many at a time as there are cores."""
    start = time.monotonic()
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        list(pool.map(lambda _: subprocess.run([sys.executable, "-c", code], check=True), range(ranks)))
    return time.monotonic() - start


def timeline_table(folder: Path, launched: float) -> str:
    """Each start-up step's seconds: median and max over the silo ranks, and the server's, on
    the wall clock and in the process's CPU (what the step costs, however many ranks share a core)."""
    ranks = sorted((json.loads(p.read_text()) for p in folder.glob("rank-*.json")), key=lambda r: -r["rank"])
    walls: dict[str, dict[int, float]] = {}
    cpus: dict[str, dict[int, float]] = {}
    for r in ranks:
        before = r["process_start"] if r["process_start"] is not None else launched
        walls.setdefault("launch", {})[r["rank"]] = before - launched
        cpu_before, seen = 0.0, set[str]()
        for step, at, cpu in r["marks"]:
            if step in seen:  # several silos on the rank: their steps, one after another
                step = f"{step} (next silo)"
            seen.add(step)
            walls.setdefault(step, {})[r["rank"]] = at - before
            cpus.setdefault(step, {})[r["rank"]] = cpu - cpu_before
            before, cpu_before = at, cpu
        cpus.setdefault("the rest of the job", {})[r["rank"]] = r["cpu_s"] - cpu_before

    def cells(by_rank: dict[int, float] | None) -> str:
        if not by_rank:
            return "– | – | –"
        silos = [s for rank, s in by_rank.items() if rank != 0]
        server = f"{by_rank[0]:.2f}" if 0 in by_rank else "–"
        return f"{statistics.median(silos):.2f} | {max(silos):.2f} | {server}" if silos else f"– | – | {server}"

    lines = [
        "| step | wall: silo ranks, median s | slowest s | server s | CPU: silo ranks, median s | most s | server s |",
        "|---|---|---|---|---|---|---|",
    ]
    # in the order of the last rank's steps (a silo's), then the server's
    lines += [f"| {step} | {cells(walls.get(step))} | {cells(cpus.get(step))} |" for step in walls | cpus]
    ends = [max(at for _, at, _ in r["marks"]) - launched for r in ranks if r["rank"] != 0 and r["marks"]]
    lines.append(f"\nthe last silo rank's hello {max(ends):.1f} s after the launch" if ends else "")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=41)
    parser.add_argument("--config", help="the job's config (default: the digits quick start, FedAvg, one round)")
    parser.add_argument("--set", action="append", default=[], help="more overrides of the job's config")
    parser.add_argument("--repeats", type=int, default=1, help="job and floor pairs, interleaved (the median ratio)")
    args = parser.parse_args(argv)
    silos = args.ranks - 1
    config, overrides = (args.config, ()) if args.config else DIGITS
    sets = [*overrides, *(o.format(silos=silos) for o in JOB), *args.set]
    cores = len(os.sched_getaffinity(0))
    pairs = []  # (job, its timeline table, the floor measured right after it)
    for _ in range(args.repeats):  # interleaved: a machine that slows down slows both alike
        with tempfile.TemporaryDirectory(prefix="cfl_timeline_") as folder:
            launched = time.time()
            job = run_job(ROOT, config, sets, args.ranks, env={"CFL_MPI_TIMELINE": folder})
            table = timeline_table(Path(folder), launched)
        pairs.append((job, table, floor_seconds(args.ranks, "import torch")))
    for job, _, floor in pairs:
        startup = job.wall_s - job.summary["wall_s"]
        print(
            f"{args.ranks} ranks to the first round: {startup:.1f} s; {args.ranks} torch imports on {cores} cores: "
            f"{floor:.1f} s; ratio {startup / floor:.2f}"
        )
    ratios = [(job.wall_s - job.summary["wall_s"]) / floor for job, _, floor in pairs]
    job, table, floor = pairs[ratios.index(statistics.median_low(ratios))]
    if args.repeats > 1:
        print(f"median ratio of {args.repeats}: {statistics.median(ratios):.2f}; the details of the run at the median:")
    startup = job.wall_s - job.summary["wall_s"]
    summary_at, folder_done_at = job.results_s
    before = summary_at - job.summary["wall_s"]
    import torch

    if torch.cuda.is_available():
        cuda_floor = floor_seconds(args.ranks, "import torch; torch.cuda.init()")
        print(
            f"  {args.ranks} torch imports with CUDA initialised: {cuda_floor:.1f} s; ratio {startup / cuda_floor:.2f}"
        )
    print(
        f"  of which before the first round {before:.1f} s, after the last round {job.wall_s - summary_at:.1f} s "
        f"(results folder {folder_done_at - summary_at:.1f} s, exit {job.wall_s - folder_done_at:.1f} s); "
        f"the run itself {job.summary['wall_s']:.1f} s"
    )
    print(
        "\nEach rank's start-up, step by step (from the launch; a step's seconds end at its mark; CPU: the "
        f"process's own, all its threads):\n\n{table}"
    )


if __name__ == "__main__":
    main()
