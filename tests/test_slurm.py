"""The sbatch scripts, run with srun/mpirun replaced by stand-ins that record their command."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

from jobs import PROJECT_ROOT

SCRIPTS = sorted((PROJECT_ROOT / "slurm").glob("*.sbatch")) + [PROJECT_ROOT / "slurm" / "common.sh"]


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
            tool.write_text(f'#!/bin/bash\nif [ "$1" = requeue ]; then echo "scontrol $*" >> "{log}"; '
                            'else echo node1; echo node2; fi\n')
        else:
            tool.write_text(f'#!/bin/bash\necho "{name} $*" >> "{log}"\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def run_script(script, stand_ins, env_extra, *args):
    bin_dir, log = stand_ins
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CFL_PYTHON": sys.executable,
           "SLURM_SUBMIT_DIR": str(PROJECT_ROOT), "SLURM_JOB_ID": "123", **env_extra}
    proc = subprocess.run(["bash", f"slurm/{script}", *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_single_node_prepares_then_runs_srun_with_the_config_rank_count(stand_ins):
    proc, calls = run_script("single_node.sbatch", stand_ins, {"SLURM_NTASKS": "9", "SLURM_JOB_NAME": "t"},
                             "configs/digits.yaml")
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"srun --mpi=pmix --ntasks=9 --kill-on-bad-exit=1 {sys.executable} -m cfl_mpi.main "
                     f"configs/digits.yaml --out runs/t-123"]


def test_single_node_refuses_a_wrong_task_count(stand_ins):
    proc, calls = run_script("single_node.sbatch", stand_ins, {"SLURM_NTASKS": "5"}, "configs/digits.yaml")
    assert proc.returncode == 2 and "needs 9 tasks but the job has 5" in proc.stderr and calls == []


def test_mpirun_fallback_and_overrides(stand_ins):
    proc, calls = run_script("single_node.sbatch", stand_ins, {"SLURM_NTASKS": "5", "CFL_LAUNCHER": "mpirun"},
                             "configs/digits.yaml", "--set", "silos=4")
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"mpirun -n 5 {sys.executable} -m cfl_mpi.main configs/digits.yaml --set silos=4 "
                     f"--out runs/cfl_mpi-123"]


def test_multi_node_puts_the_server_and_the_silos_in_two_components(stand_ins):
    proc, calls = run_script("multi_node_gpu.sbatch", stand_ins, {"SLURM_NTASKS_HET_GROUP_1": "8"},
                             "configs/digits.yaml")
    assert proc.returncode == 0, proc.stderr
    main = f"{sys.executable} -m cfl_mpi.main configs/digits.yaml --out runs/cfl_mpi_gpu-123"
    assert calls == [f"srun --mpi=pmix --kill-on-bad-exit=1 --het-group=0 {main} : --het-group=1 {main}"]
    proc, calls = run_script("multi_node_gpu.sbatch", stand_ins, {"CFL_LAUNCHER": "mpirun"}, "configs/digits.yaml")
    assert calls[-1] == f"mpirun -n 9 -hosts node1,node2 {main}"


def test_requeue_resumes_and_requeues_until_the_run_is_complete(stand_ins, tmp_path):
    env = {"SLURM_NTASKS": "9", "SLURM_JOB_NAME": "rq", "SLURM_JOB_ID": f"rq{os.getpid()}"}
    out = PROJECT_ROOT / "runs" / f"rq-rq{os.getpid()}"
    main = f"{sys.executable} -m cfl_mpi.main configs/digits.yaml"
    fresh = f"srun --mpi=pmix --ntasks=9 --kill-on-bad-exit=1 {main} --out runs/rq-rq{os.getpid()} --overwrite"
    resume = f"srun --mpi=pmix --ntasks=9 --kill-on-bad-exit=1 {main} --resume runs/rq-rq{os.getpid()}"
    proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
    assert proc.returncode == 0, proc.stderr
    # no checkpoint yet: a fresh start; the stand-in srun writes no summary, so the job is requeued
    assert calls == [fresh, f"scontrol requeue rq{os.getpid()}"]
    proc, calls = run_script("requeue.sbatch", stand_ins, {**env, "SLURM_RESTART_COUNT": "20"}, "configs/digits.yaml")
    assert proc.returncode == 1 and "not requeueing" in proc.stderr and calls[2:] == calls[:1]  # no requeue
    log = stand_ins[1]
    try:
        (out / "checkpoint").mkdir(parents=True)
        (out / "checkpoint" / "index.json").write_text("{}")
        log.unlink()
        proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
        assert proc.returncode == 0 and calls == [resume, f"scontrol requeue rq{os.getpid()}"]  # a checkpoint: resumed
        (out / "summary.json").write_text("{}")
        log.unlink()
        proc, calls = run_script("requeue.sbatch", stand_ins, env, "configs/digits.yaml")
        assert proc.returncode == 0 and calls == [resume]  # complete: not requeued
    finally:
        shutil.rmtree(out, ignore_errors=True)
