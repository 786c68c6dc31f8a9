"""Whole MPI jobs of a source tree, for the benchmarks that compare two trees side by side.

A tree is a checkout of cfl_mpi (this one, or the code before a change, e.g. `git worktree
add ../before 703ab81`); its job runs with the tree as working directory and on PYTHONPATH,
so the tree's own package is the one imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cfl_mpi.cli import find_mpirun

ROOT = Path(__file__).resolve().parents[1]
# The MNIST IDX files of the benchmarks on the MNIST test split: the folder $CFL_MPI_MNIST names,
# else data/mnist, where the MNIST configs keep them (and `python -m cfl_mpi.commands.prepare` downloads them).
MNIST = Path(os.environ.get("CFL_MPI_MNIST") or ROOT / "data" / "mnist")
MNIST_TEST = ("configs/rotated_mnist_test.yaml", (f"data.root={MNIST}", "data.download=false"))
DIGITS = ("configs/digits.yaml", ())


@dataclass
class Job:
    wall_s: float  # the whole command, start-up included
    records: list[dict]  # metrics.jsonl
    summary: dict
    pss_mb: dict[int, float]  # peak proportional set size of each rank (MPI rank → MB)
    # the peak of the ranks' PSS summed at one moment: what the machine holds at once (MB)
    tree_pss_mb: float
    # wall-clock seconds from the job's start to the server's writing summary.json (its rounds
    # are over) and to its last plot (the results folder complete); the rest is the teardown
    results_s: tuple[float, float] = (float("nan"), float("nan"))


def mpirun() -> str:
    found = find_mpirun()
    if not found:
        raise SystemExit("no mpirun found (pip install mpich, or load the site's MPI)")
    return found


def run_job(
    tree: Path,
    config: str,
    overrides: list[str],
    ranks: int,
    timeout: float = 3600,
    env: dict[str, str] | None = None,
    keep: Path | None = None,
) -> Job:
    """`mpirun -n ranks python -m cfl_mpi.main config --set ...` in `tree`; its wall and results
    (`env`: more environment variables for the ranks; `keep`: the results folder to keep, else
    a temporary one)."""
    with tempfile.TemporaryDirectory(prefix="cfl_bench_") as scratch:
        out = str(keep) if keep is not None else scratch
        sets = [a for o in overrides for a in ("--set", o)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree), **(env or {})}
        cmd = [mpirun(), "-n", str(ranks), sys.executable, "-m", "cfl_mpi.main", config, "--out", out, *sets]
        start, started = time.monotonic(), time.time()
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peaks: dict[int, float] = {}
        together = [0.0]
        sampler = threading.Thread(target=sample_pss, args=(proc, peaks, together), daemon=True)
        sampler.start()
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        wall = time.monotonic() - start
        sampler.join()
        if proc.returncode != 0:
            raise RuntimeError(f"job failed in {tree} ({proc.returncode}): {' '.join(cmd)}\n{stderr[-3000:]}")
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        written = [p.stat().st_mtime - started for p in Path(out).iterdir() if p.is_file()]
        results = ((Path(out) / "summary.json").stat().st_mtime - started, max(written))
        summary = json.loads((Path(out) / "summary.json").read_text())
        return Job(wall, records, summary, peaks, together[0], results)


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        kids = [int(p) for p in children.read_text().split()]
    except OSError:
        return []
    return kids + [d for k in kids for d in _descendants(k)]


def _mpi_rank(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((e.split(b"=", 1)[1] for e in env if e.startswith((b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK="))), None)
    return int(rank) if rank is not None else None


def sample_pss(proc: subprocess.Popen, peaks: dict[int, float], together: list[float], every_s: float = 0.5) -> None:
    """Peak PSS (shared pages counted once: /proc/PID/smaps_rollup) of each MPI rank of a job,
    and in together[0] the peak of their sum at one moment (the ranks peak at different times:
    the server as it gathers the updates, a silo rank as it trains)."""
    while proc.poll() is None:
        now = {}
        for pid in _descendants(proc.pid):
            rank = _mpi_rank(pid)
            if rank is not None:
                now[rank] = _pss_kb(pid) / 1024
                peaks[rank] = max(peaks.get(rank, 0.0), now[rank])
        together[0] = max(together[0], sum(now.values()))
        time.sleep(every_s)


def _pss_kb(pid: int) -> int:
    """A process's proportional set size (/proc/PID/smaps_rollup), 0 once it has gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)


def tree_pss_mb(pid: int) -> float:
    """PSS of a process and its descendants, summed (MB): the memory a command holds at once."""
    return sum(_pss_kb(each) for each in (pid, *_descendants(pid))) / 1024


def sample_tree_pss(proc: subprocess.Popen, peak: list[float], every_s: float = 0.5) -> None:
    """peak[0]: the largest `tree_pss_mb` of the command while it runs."""
    while proc.poll() is None:
        peak[0] = max(peak[0], tree_pss_mb(proc.pid))
        time.sleep(every_s)


def run_watched(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[str, float, float]:
    """Run a command to its end: its output (stdout and stderr together), wall seconds and the
    peak PSS (MB) of its whole process tree; RuntimeError with the output's tail if it fails."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0.0]
    sampler = threading.Thread(target=sample_tree_pss, args=(proc, peak), daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    wall = time.monotonic() - start
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    return output, wall, peak[0]


def clustering_s(job: Job) -> float:
    """Seconds of the server's clustering phase, summed over rounds (EMD-CFL: round 1 only)."""
    return sum(r["seconds"].get("clustering", 0.0) for r in job.records)


def machine() -> str:
    """One line on where the figures come from: cores, CPU model, load, library versions."""
    import numpy
    import scipy
    import torch

    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown CPU",
        )
        if Path("/proc/cpuinfo").exists()
        else "unknown CPU"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), {model}; load average {load:.1f}; "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}, "
        f"scipy {scipy.__version__}"
    )
