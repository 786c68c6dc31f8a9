"""Real `mpirun` jobs: a damaged or occupied results folder, a failed download and a GPU asked
for where there is none are one config-error line and exit code 2 before any work, and leave
nothing behind on disk."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from jobs import PROJECT_ROOT, mpirun, run_job

pytestmark = pytest.mark.mpi

DIGITS = "configs/digits.yaml"
TWO = [
    "silos=2",
    "data.rotations=[0,180]",
    "train.rounds=1",
    "train.local_epochs=1",
    "model.channels=[8,16]",
    "strategy.name=fedavg",
]


def main_job(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    sets = [a for o in TWO for a in ("--set", o)]
    return subprocess.run(
        [mpirun(), "-n", "3", sys.executable, "-m", "cfl_mpi.main", DIGITS, *args, *sets],
        cwd=PROJECT_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def config_error(proc: subprocess.CompletedProcess, field: str) -> str:
    """The job's single error line, which must name `field`."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "config error" in line]
    assert len(lines) == 1 and lines[0].startswith(f"cfl_mpi: config error: {field}: "), proc.stderr[-3000:]
    assert "round 1" not in proc.stdout  # no work started
    return lines[0]


def test_an_occupied_or_damaged_results_folder_is_refused_before_any_work(tmp_path):
    out = tmp_path / "run"
    run_job(DIGITS, out, *TWO, n=3)
    line = config_error(main_job("--out", str(out)), "out")  # a second experiment would mix its rounds in
    assert "already holds a run" in line and "--overwrite" in line
    (out / "checkpoint" / "round1.npz").unlink()  # today's bug: this resumed "from round 1" and exited 0
    assert "round1.npz is missing" in config_error(main_job("--resume", str(out)), "--resume")
    typo = tmp_path / "typo"
    assert "typo does not exist" in config_error(main_job("--resume", str(typo)), "--resume")
    assert not typo.exists()


def test_cuda_without_a_gpu_stops_the_job_before_any_work(tmp_path):
    """runtime.device: cuda where a silo rank sees no GPU: one line naming the rank and what torch
    says, exit 2 on every rank, no results folder."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: runtime.device: cuda runs here")
    out = tmp_path / "run"
    line = config_error(main_job("--out", str(out), "--set", "runtime.device=cuda"), "runtime.device")
    assert "cuda, but rank 1 on " in line and "has no usable GPU: torch " in line
    assert not out.exists()


def test_a_failed_download_leaves_no_data_folder_and_no_results_folder(tmp_path):
    root, out = tmp_path / "data" / "mnist", tmp_path / "out"
    unreachable = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
    proc = main_job(
        "--out", str(out), "--set", "data.name=rotated_mnist", "--set", f"data.root={root}", env=unreachable
    )
    assert "downloading it failed" in config_error(proc, "data.root")
    assert list(tmp_path.iterdir()) == []  # torchvision made data/mnist/MNIST/raw before it failed
