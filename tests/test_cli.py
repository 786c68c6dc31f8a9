"""The command line outside MPI: the rank-count helper the launcher uses."""
import subprocess
import sys

from jobs import PROJECT_ROOT


def run(*args):
    return subprocess.run([sys.executable, "-m", "cfl_mpi.ranks", *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_ranks_reads_the_config_and_overrides():
    assert run("configs/digits.yaml").stdout.strip() == "9"
    assert run("configs/digits.yaml", "--set", "silos=4").stdout.strip() == "5"
    assert run("configs/rotated.yaml").stdout.strip() == "41"


def test_ranks_reports_config_errors_with_exit_2():
    proc = run("configs/digits.yaml", "--set", "train.epochz=1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("cfl_mpi: config error: train.epochz: unknown key (valid keys here: "
                                   "rounds, local_epochs, lr, momentum, weight_decay, batch_size)")


def test_numbers_on_the_command_line_yaml_1_2_floats_and_finite_only():
    assert run("configs/digits.yaml", "--set", "train.lr=1e-3").stdout.strip() == "9"
    proc = run("configs/digits.yaml", "--set", "train.lr=.nan")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "cfl_mpi: config error: train.lr: must be a finite number, got nan"
