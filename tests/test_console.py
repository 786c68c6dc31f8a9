"""The console's three levels: quiet keeps warnings, the default adds a line a round, verbose
the details; a job's --quiet and --verbose choose them."""

from __future__ import annotations

import pytest
from config_files import FOUR_SILOS, write_config
from jobs import run_mpi

from cfl_mpi import console


@pytest.fixture(autouse=True)
def default_level():
    yield
    console.setup()


@pytest.mark.parametrize(
    "level, shown", [("quiet", ["warn"]), ("normal", ["say", "warn"]), ("verbose", ["say", "detail", "warn"])]
)
def test_each_level_shows_what_it_promises(capsys, level, shown):
    console.setup(level)
    console.say("say")
    console.detail("detail")
    console.warn("warn")
    assert capsys.readouterr().out.split() == shown


def test_lines_go_to_the_stdout_of_the_moment(capsys):
    """A handler made before a test swapped sys.stdout still writes where stdout is now."""
    console.say("first")
    assert capsys.readouterr().out == "first\n"


@pytest.mark.mpi
@pytest.mark.parametrize("flag", ["--quiet", "--verbose"])
def test_a_job_s_console_level(tmp_path, flag):
    config = write_config(tmp_path, FOUR_SILOS.replace("strategy: {name: pacfl}", "strategy: {name: emdcfl}"))
    small = ["--set", "runtime.silos_per_rank=2", "--set", "model.channels=[16,32]"]  # 3 ranks, a slim CNN
    proc = run_mpi(3, ["-m", "cfl_mpi.main", str(config), "--out", str(tmp_path / "run"), *small, flag])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rounds = [line for line in out.splitlines() if line.startswith("round 2/2")]
    if flag == "--quiet":
        assert not rounds and "done:" not in out, out
    else:
        assert rounds and "steps" in out and "done:" in out, out
