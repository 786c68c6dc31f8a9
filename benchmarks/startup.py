"""Start-up of a wide job: 41 ranks (server + 40 silos) to the first round, against the floor
of 41 Python processes importing torch on this machine's cores.

    python -m benchmarks.startup [--ranks 41]

The job's start-up is its wall minus the server's own run (`summary.json` wall_s): launching,
imports, data and model building on every rank, the placement and the hello, and also what
follows the last round: the results folder (plots) and the ranks' exit. Both parts are shown:
"to the first round" ends where the server's run starts (summary.json's time less wall_s),
"after the last round" begins where summary.json is written. The floor runs the same number
of `python -c "import torch"` processes (each starts, imports and exits), as many at a time
as there are cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .runs import DIGITS, ROOT, run_job


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=41)
    args = parser.parse_args(argv)
    silos = args.ranks - 1
    config, overrides = DIGITS
    job = run_job(ROOT, config, [*overrides, f"silos={silos}", "train.rounds=1", "train.local_epochs=1",
                                 "model.channels=[16,32]", "strategy.name=fedavg"], args.ranks)
    startup = job.wall_s - job.summary["wall_s"]
    summary_at, folder_done_at = job.results_s
    before = summary_at - job.summary["wall_s"]
    cores = len(os.sched_getaffinity(0))
    start = time.monotonic()
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(lambda _: subprocess.run([sys.executable, "-c", "import torch"], check=True),
                      range(args.ranks)))
    floor = time.monotonic() - start
    print(f"{args.ranks} ranks to the first round: {startup:.1f} s; {args.ranks} torch imports on {cores} cores: "
          f"{floor:.1f} s; ratio {startup / floor:.2f}")
    print(f"  of which before the first round {before:.1f} s, after the last round {job.wall_s - summary_at:.1f} s "
          f"(results folder {folder_done_at - summary_at:.1f} s, exit {job.wall_s - folder_done_at:.1f} s); "
          f"the run itself {job.summary['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
