"""Whole runs from tests: real `mpirun` jobs, or the in-process simulator; and what they wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cfl_mpi.cli import find_mpirun

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The markers of the test being run (conftest sets them): a whole job needs one of SLOW, so that
# `pytest -m "not job and not mpi and not slurm"` stays the quick loop of units.
SLOW = frozenset({"job", "mpi", "slurm", "cuda", "nodes"})
running_marks: frozenset[str] = SLOW


def require_slow_marker(what: str) -> None:
    if not running_marks & SLOW:
        raise AssertionError(
            f"{what} in a test without a marker of {sorted(SLOW)}: mark it (pyproject.toml lists them)"
        )


def mpirun() -> str:
    """The mpirun next to this Python (pip's mpich) or on PATH; skip if there is none."""
    found = find_mpirun()
    if not found:
        pytest.skip("no mpirun found (pip install mpich, or load the site's MPI)")
    return found


def run_mpi(n: int, args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `mpirun -n n python <args>` from the project root; output captured as text."""
    require_slow_marker("an mpirun job")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [mpirun(), "-n", str(n), sys.executable, *args]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_job(config: str, out: Path, *overrides: str, n: int | None = None, timeout: float = 900):
    """Run the main job on `config` with overrides; return (process, summary, metrics records)."""
    sets = [a for o in overrides for a in ("--set", o)]
    silos = next((int(o.split("=")[1]) for o in overrides if o.startswith("silos=")), None)
    n = n or (silos + 1 if silos else 9)
    proc = run_mpi(n, ["-m", "cfl_mpi.main", config, "--out", str(out), *sets], timeout)
    if proc.returncode != 0:
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return (proc, *read_results(out))


def run_sockets(n: int, args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `python -m cfl_mpi.backends.sockets -n n <args>` from the project root; output captured as text."""
    require_slow_marker("a job on sockets")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "cfl_mpi.backends.sockets", "-n", str(n), *args]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def failure_of(out: Path) -> str:
    """The results folder's failure.txt (empty if none): why a failed job stopped. Tests read
    it rather than mpirun's stderr, which may lose what a rank wrote just before MPI_Abort."""
    path = out / "failure.txt"
    return path.read_text() if path.exists() else ""


def read_results(out: Path) -> tuple[dict, list[dict]]:
    """(summary.json, the records of metrics.jsonl) of a finished run."""
    summary = json.loads((out / "summary.json").read_text())
    return summary, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_results(run: Path) -> dict:
    """What two runs of one experiment must share bit for bit: each round's clusters, per-silo
    accuracies and ARI, and the distance matrix W."""
    import numpy as np

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"clusters": [r["clusters"] for r in records], "accuracy": [r["accuracy"] for r in records],
            "W": np.load(run / "W.npy"), "ari": [r["ari"] for r in records]}  # fmt: skip


def assert_same_results(a: dict, b: dict) -> None:
    import numpy as np

    assert a["clusters"] == b["clusters"] and a["accuracy"] == b["accuracy"] and a["ari"] == b["ari"]
    np.testing.assert_array_equal(a["W"], b["W"])


def simulate_job(config: str, out: Path, *overrides: str) -> tuple[dict, list[dict]]:
    """Run `config` with overrides in this process (cfl_mpi.backends.simulate); return (summary, records)."""
    from cfl_mpi.backends.simulate import simulate
    from cfl_mpi.config import load_config

    require_slow_marker("a simulated job")
    cfg = load_config(PROJECT_ROOT / config, [*overrides, f"out={out}"])
    simulate(cfg)
    return read_results(out)
