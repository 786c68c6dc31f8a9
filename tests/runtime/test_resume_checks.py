"""A mistaken `--resume` under mpirun (a finished run, a missing folder, another config) is one
config-error line and exit code 2 from every rank before any rank imports torch: the ranks run
with torch made unimportable, so a check that needs it fails the job instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from jobs import PROJECT_ROOT, mpirun

from cfl_mpi.config import config_digest, load_config
from cfl_mpi.models.build import initial_model
from cfl_mpi.runtime.checkpoint import Checkpoint, save_checkpoint
from cfl_mpi.runtime.halves import server_half

pytestmark = pytest.mark.mpi

DIGITS = "configs/digits.yaml"
TWO = [
    "silos=2",
    "data.rotations=[0,180]",
    "train.rounds=2",
    "train.local_epochs=1",
    "model.channels=[8,16]",
    "strategy.name=fedavg",
]
# cfl_mpi.main with `import torch` failing (ImportError) on every rank
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from cfl_mpi.main import cli; cli()"


def write_run(out, rounds: int) -> None:
    """A results folder as the server leaves it after `rounds` rounds, by the real writer."""
    cfg = load_config(DIGITS, [*TWO, f"out={out}"])
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    arrays, meta = server_half(cfg).state_dict()
    run_meta = {
        "strategy": meta,
        "trained": [0, 1],
        "first_counts": {"0": 10, "1": 12},
        "records": [{"round": r + 1} for r in range(rounds)],
    }
    save_checkpoint(
        out,
        Checkpoint(rounds, [initial_model(cfg.architecture, cfg.seed)], [0, 0], arrays, run_meta, config_digest(cfg)),
    )


def resume_without_torch(folder, *sets: str) -> tuple[subprocess.CompletedProcess, float]:
    args = [a for o in (*TWO, *sets) for a in ("--set", o)]
    start = time.monotonic()
    proc = subprocess.run(
        [mpirun(), "-n", "3", sys.executable, "-c", WITHOUT_TORCH, DIGITS, "--resume", str(folder), *args],
        cwd=PROJECT_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_run(root / "finished", 2)
    (root / "finished" / "summary.json").write_text(json.dumps({"wall_s": 1.0}))
    write_run(root / "stopped", 1)
    return root


@pytest.mark.parametrize(
    "folder,sets,line",
    [
        (
            "finished",
            (),
            "--resume: {root}/finished finished all 2 rounds (its summary.json is written): nothing to continue",
        ),
        (
            "typo",
            (),
            "--resume: {root}/typo does not exist (give the results folder of the run to continue, or start a "
            "fresh run with --out)",
        ),
        (
            "stopped",
            ("train.lr=0.5",),
            "train.lr: differs from the run being resumed in {root}/stopped (resume with the "
            "config and --set options it was started with)",
        ),
    ],
)
def test_a_mistaken_resume_is_one_line_before_torch(runs, folder, sets, line):
    proc, wall = resume_without_torch(runs / folder, *sets)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip() == f"cfl_mpi: config error: {line.format(root=runs)}"  # one rank speaks
    assert proc.stdout == "" and not (runs / "typo").exists()
    assert wall < 30  # no rank waited for another's timeout


def test_an_intact_resume_gets_past_the_early_checks_to_torch(runs):
    """The control: the stopped run's checkpoint passes the early checks, and the job, which
    then needs torch for θ(0), ends (aborted) instead of resuming or hanging."""
    proc, _ = resume_without_torch(runs / "stopped")
    assert proc.returncode not in (0, 2), proc.stderr[-3000:]
    assert re.search(
        r"rank \d failed while checking the config: ModuleNotFoundError: import of torch halted", proc.stderr
    )
