"""What a rank did before its first round, and when: the start-up timeline.

Each rank marks the steps of its start-up (`mark`: a few per rank and per silo it hosts),
with the wall-clock time and the process's CPU seconds so far (on a node with more ranks than
cores, CPU seconds say what a step costs, the wall what it waited). Where the environment names
a folder in CFL_MPI_TIMELINE, the rank writes its marks there as `rank-<N>.json` when the job
ends (`write`), with the wall-clock time its process started (from /proc) and its CPU seconds
by then; otherwise nothing is written. `benchmarks/startup.py` reads the files into a per-rank
timeline of a wide job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENVIRONMENT = "CFL_MPI_TIMELINE"
MARKS: list[tuple[str, float, float]] = []  # (step, wall-clock time it ended, CPU seconds by then), in order


def mark(step: str) -> None:
    """The step of this process's start-up that has just ended."""
    MARKS.append((step, time.time(), time.process_time()))


def process_start() -> float | None:
    """The wall-clock time this process started (Linux: /proc), None where it is not known."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def write(rank: int, role: str) -> None:
    """This rank's marks to $CFL_MPI_TIMELINE/rank-<rank>.json, if that is set."""
    folder = os.environ.get(ENVIRONMENT)
    if not folder:
        return
    record = {
        "rank": rank,
        "role": role,
        "process_start": process_start(),
        "marks": MARKS,
        "cpu_s": time.process_time(),  # the process's CPU seconds by the end of its job
    }
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(record))
