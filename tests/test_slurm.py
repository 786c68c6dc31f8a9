"""The sbatch scripts, run with srun/mpirun replaced by stand-ins that record their command."""

import os
import shutil
import stat
import subprocess
import sys

import pytest
from jobs import PROJECT_ROOT

from cfl_mpi.backends.mpi.srun import chosen_plugin, plugin_for

SCRIPTS = sorted((PROJECT_ROOT / "slurm").glob("*.sbatch")) + sorted((PROJECT_ROOT / "slurm").glob("*.sh"))
MPICH_WHEEL = (
    "MPICH Version:      5.0.2\nMPICH ABI:          18:2:6\nMPICH Device:       ch4:ucx ofi\n"
    "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
)


def probe(ranks: int, layout: str, mpi: str = "pmi2") -> str:
    """The srun step that checks the PMI plugin before the run (common.sh's cfl_srun_mpi)."""
    return (
        f"srun --mpi={mpi} {layout} --kill-on-bad-exit=1 {sys.executable} "
        f"-m cfl_mpi.backends.mpi.srun --check-world {ranks}"
    )


@pytest.mark.parametrize(
    "version,plugin",
    [
        (MPICH_WHEEL, "pmi2"),
        ("MPICH Version: 4.1\nMPICH configure: --with-pmix=/usr --with-pm=no\n", "pmix"),
        ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022", "pmix"),
        ("Intel(R) MPI Library 2021.10 for Linux* OS", "pmi2"),
    ],
    ids=["mpich_wheel", "mpich_with_pmix", "open_mpi", "intel_mpi"],
)
def test_the_srun_plugin_follows_the_mpi_library(version, plugin):
    assert plugin_for(version) == plugin


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.fixture
def stand_ins(tmp_path):
    """A bin folder whose srun/mpirun/scontrol print their arguments to a log instead of running."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("srun", "mpirun", "scontrol"):
        tool = bin_dir / name
        if name == "scontrol":  # `show hostnames` lists two nodes; `requeue` is recorded
            tool.write_text(
                f'#!/bin/bash\nif [ "$1" = requeue ]; then echo "scontrol $*" >> "{log}"; '
                "else echo node1; echo node2; fi\n"
            )
        else:
            tool.write_text(
                f'#!/bin/bash\necho "{name} $*" >> "{log}"\n'
                f'[ -z "$FAIL_PROBE" ] || [[ "$*" != *--check-world* ]] || exit 1\n'
            )
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def run_script(script, stand_ins, env_extra, *args):
    bin_dir, log = stand_ins
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CFL_PYTHON": sys.executable,
        "SLURM_SUBMIT_DIR": str(PROJECT_ROOT),
        "SLURM_JOB_ID": "123",
        **env_extra,
    }
    proc = subprocess.run(
        ["bash", f"slurm/{script}", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_single_node_prepares_checks_the_pmi_then_runs_srun_with_the_config_rank_count(stand_ins):
    proc, calls = run_script(
        "single_node.sbatch", stand_ins, {"SLURM_NTASKS": "9", "SLURM_JOB_NAME": "t"}, "configs/digits.yaml"
    )
    assert proc.returncode == 0, proc.stderr
    mpi = chosen_plugin()  # pmi2 for the MPICH wheel
    assert calls == [
        probe(9, "--ntasks=9", mpi),
        f"srun --mpi={mpi} --ntasks=9 --kill-on-bad-exit=1 {sys.executable} -m cfl_mpi.main "
        f"configs/digits.yaml --out runs/t-123",
    ]


def test_a_pmi_that_does_not_start_the_world_stops_the_job_in_one_line(stand_ins):
    proc, calls = run_script(
        "single_node.sbatch",
        stand_ins,
        {"SLURM_NTASKS": "9", "CFL_SRUN_MPI": "pmix", "FAIL_PROBE": "1"},
        "configs/digits.yaml",
    )
    assert proc.returncode == 2 and calls[0] == probe(9, "--ntasks=9", "pmix")
    assert not any("cfl_mpi.main" in call for call in calls)  # the run never starts
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "srun --mpi=pmix did not start one MPI world of 9 ranks" in lines[0]
    assert "set CFL_SRUN_MPI" in lines[0]


def test_single_node_refuses_a_wrong_task_count(stand_ins):
    proc, calls = run_script("single_node.sbatch", stand_ins, {"SLURM_NTASKS": "5"}, "configs/digits.yaml")
    assert proc.returncode == 2 and "needs 9 tasks but the job has 5" in proc.stderr and calls == []


def test_mpirun_fallback_and_overrides(stand_ins):
    proc, calls = run_script(
        "single_node.sbatch",
        stand_ins,
        {"SLURM_NTASKS": "5", "CFL_LAUNCHER": "mpirun"},
        "configs/digits.yaml",
        "--set",
        "silos=4",
    )
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        f"mpirun -n 5 {sys.executable} -m cfl_mpi.main configs/digits.yaml --set silos=4 --out runs/cfl_mpi-123"
    ]


def test_several_silos_per_rank_set_the_task_count(stand_ins):
    sets = ["--set", "silos=8", "--set", "runtime.silos_per_rank=3"]
    proc, calls = run_script("single_node.sbatch", stand_ins, {"SLURM_NTASKS": "9"}, "configs/digits.yaml", *sets)
    assert proc.returncode == 2 and "needs 4 tasks but the job has 9 (submit with --ntasks=4)" in proc.stderr
    proc, calls = run_script(
        "single_node.sbatch", stand_ins, {"SLURM_NTASKS": "4", "CFL_SRUN_MPI": "pmi2"}, "configs/digits.yaml", *sets
    )
    assert proc.returncode == 0 and calls[-1].startswith("srun --mpi=pmi2 --ntasks=4 ")


def test_multi_node_runs_both_components_in_one_world(stand_ins):
    env = {"SLURM_NTASKS_HET_GROUP_1": "8", "CFL_SRUN_MPI": "pmi2"}
    proc, calls = run_script("multi_node_gpu.sbatch", stand_ins, env, "configs/digits.yaml")
    assert proc.returncode == 0, proc.stderr
    main = f"{sys.executable} -m cfl_mpi.main configs/digits.yaml --out runs/cfl_mpi_gpu-123"
    assert calls == [probe(9, "--het-group=0,1"), f"srun --mpi=pmi2 --het-group=0,1 --kill-on-bad-exit=1 {main}"]
    proc, calls = run_script("multi_node_gpu.sbatch", stand_ins, {"CFL_LAUNCHER": "mpirun"}, "configs/digits.yaml")
    assert calls[-1] == f"mpirun -n 9 -hosts node1,node2 {main}"
    # 8 silos, 4 per rank: 2 silo ranks, whatever the script's default component size
    proc, calls = run_script(
        "multi_node_gpu.sbatch",
        stand_ins,
        {"SLURM_NTASKS_HET_GROUP_1": "8"},
        "configs/digits.yaml",
        "--set",
        "runtime.silos_per_rank=4",
    )
    assert proc.returncode == 2
    assert (
        "needs 2 silo ranks but the job's silo component has 8 tasks (submit with --ntasks=1 : --ntasks=2)"
        in proc.stderr
    )


def test_requeue_resumes_and_requeues_until_the_run_is_complete(stand_ins, tmp_path):
    env = {"SLURM_NTASKS": "9", "SLURM_JOB_NAME": "rq", "SLURM_JOB_ID": f"rq{os.getpid()}", "CFL_SRUN_MPI": "pmi2"}
    out = PROJECT_ROOT / "runs" / f"rq-rq{os.getpid()}"
    main = f"{sys.executable} -m cfl_mpi.main configs/digits.yaml"
    check = probe(9, "--ntasks=9")
    fresh = f"srun --mpi=pmi2 --ntasks=9 --kill-on-bad-exit=1 {main} --out runs/rq-rq{os.getpid()} --overwrite"
    resume = f"srun --mpi=pmi2 --ntasks=9 --kill-on-bad-exit=1 {main} --resume runs/rq-rq{os.getpid()}"
    proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
    assert proc.returncode == 0, proc.stderr
    # no checkpoint yet: a fresh start; the stand-in srun writes no summary, so the job is requeued
    assert calls == [check, fresh, f"scontrol requeue rq{os.getpid()}"]
    proc, calls = run_script("requeue.sbatch", stand_ins, {**env, "SLURM_RESTART_COUNT": "20"}, "configs/digits.yaml")
    assert proc.returncode == 1 and "not requeueing" in proc.stderr and calls[3:] == [check, fresh]  # no requeue
    log = stand_ins[1]
    try:
        (out / "checkpoint").mkdir(parents=True)
        (out / "checkpoint" / "index.json").write_text("{}")
        log.unlink()
        proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
        assert proc.returncode == 0 and calls == [check, resume, f"scontrol requeue rq{os.getpid()}"]  # resumed
        (out / "summary.json").write_text("{}")
        log.unlink()
        proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
        assert proc.returncode == 0 and calls == [check, resume]  # complete: not requeued
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_launch_print_follows_several_silos_per_rank(capsys):
    from cfl_mpi.commands.launch import main

    main(["--print", "configs/digits.yaml", "--set", "silos=40", "--set", "runtime.silos_per_rank=5"])
    lines = capsys.readouterr().out.splitlines()
    args = "configs/digits.yaml --set silos=40 --set runtime.silos_per_rank=5"
    assert lines[0] == "# digits: 40 silos, 5 per rank: 9 ranks (1 server + 8 silo ranks)"
    assert lines[1:] == [
        f"mpirun -n 9 python -m cfl_mpi.main {args}",
        f"srun --mpi={chosen_plugin()} --ntasks=9 --kill-on-bad-exit=1 python -m cfl_mpi.main {args}",
        f"sbatch --ntasks=9 slurm/single_node.sbatch {args}",
        f"sbatch --ntasks=9 slurm/requeue.sbatch {args}",
        f"sbatch --ntasks=1 : --ntasks=8 slurm/multi_node_gpu.sbatch {args}",
    ]


def test_launch_print_refuses_a_bad_config_in_one_line(capsys):
    from cfl_mpi.commands.launch import main

    with pytest.raises(SystemExit) as exit_:
        main(["--print", "configs/digits.yaml", "--set", "silos=x"])
    assert (
        exit_.value.code == 2
        and capsys.readouterr().err.strip() == "cfl_mpi: config error: silos: expected an integer, got 'x'"
    )
