"""The command line: the rank-count helper the launcher uses, the run options that cannot go
together, the commands' help, and how an MPI rank's process ends."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from jobs import PROJECT_ROOT


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "cfl_mpi.commands.ranks", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ranks_reads_the_config_and_overrides():
    assert run("configs/digits.yaml").stdout.strip() == "9"
    assert run("configs/digits.yaml", "--set", "silos=4").stdout.strip() == "5"
    assert run("configs/rotated.yaml").stdout.strip() == "41"


def test_ranks_reports_config_errors_with_exit_2():
    proc = run("configs/digits.yaml", "--set", "train.epochz=1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "cfl_mpi: config error: train.epochz: unknown key (valid keys here: "
        "rounds, local_epochs, lr, momentum, weight_decay, batch_size)"
    )


def test_numbers_on_the_command_line_yaml_1_2_floats_and_finite_only():
    assert run("configs/digits.yaml", "--set", "train.lr=1e-3").stdout.strip() == "9"
    proc = run("configs/digits.yaml", "--set", "train.lr=.nan")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "cfl_mpi: config error: train.lr: must be a finite number, got nan"


def test_resume_with_another_out_folder_is_a_config_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cfl_mpi.backends.simulate",
            "configs/digits.yaml",
            "--resume",
            str(tmp_path / "a"),
            "--out",
            str(tmp_path / "b"),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"cfl_mpi: config error: --out: cannot be combined with --resume (the run "
        f"continues in its own folder {tmp_path / 'a'})"
    )


def test_the_simulator_s_first_line_says_where_the_silos_compute(tmp_path):
    """runtime.device: cpu says the CPU on any machine. The line comes before the data and weights
    are prepared: a weights file that is missing stops the run right after it, with exit 2."""
    out, weights = tmp_path / "run", tmp_path / "missing.pth"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cfl_mpi.backends.simulate",
            "configs/digits.yaml",
            "--out",
            str(out),
            "--set",
            "silos=4",
            "--set",
            "train.rounds=2",
            "--set",
            "runtime.device=cpu",
            "--set",
            f"model.pretrained={weights}",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "config error: model.pretrained: cannot load weights" in proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first == f"digits: emdcfl, 4 silos in one process on the CPU, 2 rounds; results in {out}"


def documented_commands() -> list[str]:
    """Every `python -m cfl_mpi.X` the README, the SLURM notes and the docs tell a user to run."""
    pages = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "slurm" / "README.md", *(PROJECT_ROOT / "docs").rglob("*.md")]
    found = {m for page in pages for m in re.findall(r"python3? -m (cfl_mpi(?:\.\w+)+)", page.read_text())}
    return sorted(found)


def test_the_docs_name_the_commands_the_help_test_runs():
    assert {"cfl_mpi.main", "cfl_mpi.backends.simulate", "cfl_mpi.experiments.compare"} <= set(documented_commands())


@pytest.mark.parametrize("command", documented_commands())
def test_every_command_s_help_says_what_it_does_in_a_sentence(command):
    proc = subprocess.run(
        [sys.executable, "-m", command, "--help"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    description = proc.stdout.split("\n\n")[1]
    assert description[0].isupper() and description.rstrip().endswith("."), description
    assert "`" not in description, description


def test_the_console_script_runs_the_job_s_command():
    script = Path(sys.executable).parent / "cfl-mpi"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}: the package is not installed with pip")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "config" in proc.stdout, proc.stderr


# A rank ends as cfl_mpi.main ends it: a barrier, MPI_Finalize, then cli.exit_rank.
RANK_EXIT = (
    "from mpi4py import MPI; from cfl_mpi.backends.mpi.placement import wait_quietly; "
    "from cfl_mpi.cli import exit_rank; wait_quietly(MPI.COMM_WORLD.Ibarrier()); MPI.Finalize(); exit_rank(0)"
)


@pytest.mark.mpi
def test_ranks_that_skip_the_interpreter_s_teardown_still_end_the_job_cleanly():
    """With os._exit instead, hydra's proxy killed the other ranks of 26 of 30 such jobs
    (mpiexec exit 9), and this test fails at once."""
    from jobs import run_mpi

    for _ in range(5):
        proc = run_mpi(7, ["-c", RANK_EXIT], timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
