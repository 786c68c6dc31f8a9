"""The sbatch scripts on a real SLURM: a private two-node cluster on this machine
(slurm/local_cluster.sh, installed with apt where sbatch is missing), jobs submitted as the
README tells users, and the results folders they wrote checked.

Where emulated nodes can be made (tests/nodes.py: root, network namespaces), each slurmd runs
in a node of its own, its host name its NodeName, the controller reached over the nodes'
bridge: a job's ranks on two nodes talk over the network. Elsewhere both slurmd share this
machine's network (the heterogeneous job, which needs two nodes, then skips).

Skips with the reason where the cluster cannot run (not root, no apt-get, not Linux), or
with CFL_TEST_SLURM=0. The daemons run for this module only and are stopped at its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from jobs import PROJECT_ROOT, read_results
from nodes import EmulatedNodes, can_make_nodes

pytestmark = [pytest.mark.mpi, pytest.mark.slurm]

CLUSTER = PROJECT_ROOT / "slurm" / "local_cluster.sh"
CONFIG = "configs/digits.yaml"
# 4 silos in two rotation clusters, a small CNN: about a second a round on two shared cores.
SMALL = [
    "silos=4",
    "data.rotations=[0, 90]",
    "model.channels=[16, 32]",
    "model.embedding_dim=32",
    "train.local_epochs=2",
]
# requeue.sbatch's own warning (--signal=TERM@600 in a --time=04:00:00 job) comes when the time
# left is at most 10 minutes, checked every 30 s. The test brings that moment forward, once
# the job has done its first round, by shortening its time limit as an admin would (`scontrol
# update TimeLimit=`: 5-6 minutes left), so the real signal lands mid-run on a machine of
# any speed; once the job is requeued it gets its 4 hours back and the resumed attempt runs
# to the end. One silo starts every round 1.5 s late (a straggler, `runtime.fault` kind slow:
# the results stay the honest ones), so 40 rounds outlast the check's 30 s twice over, at
# any CPU's speed, without keeping the cores busy for it.
ROUNDS = 40
WARN_AFTER_ROUND = 1
STRAGGLER = ["runtime.fault.silo=0", "runtime.fault.round=1", "runtime.fault.kind=slow", "runtime.fault.delay_s=1.5"]
LONG = [*SMALL, f"train.rounds={ROUNDS}", *STRAGGLER]
OFI_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}  # MPI on the nodes' link
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@dataclass
class Cluster:
    env: dict[str, str]
    logs: Path
    nodes: EmulatedNodes | None  # the nodes the slurmd run in, or None: all on this machine's network

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=self.env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def sbatch(self, name: str, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit as the README says, plus a job name and a log file of the test's own."""
        cmd = ["sbatch", "--parsable", f"--job-name={name}", f"--output={self.logs / name}.out", *args]
        proc = subprocess.run(
            cmd, cwd=PROJECT_ROOT, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as key=value pairs (of the first component of a heterogeneous job)."""
        line = self.run("scontrol", "show", "job", "-o", job_id).stdout.splitlines()[0]
        return dict(field.split("=", 1) for field in line.split() if "=" in field)

    def wait(self, job_id: str, timeout: float = 1500) -> dict[str, str]:
        """The job's final `scontrol` fields."""
        deadline = time.monotonic() + timeout
        while (info := self.job(job_id))["JobState"] not in FINAL:
            assert time.monotonic() < deadline, f"job {job_id} still {info['JobState']} after {timeout} s"
            time.sleep(1)
        return info

    def log(self, name: str) -> str:
        """A job's output; bytes that are not UTF-8 replaced (slurmstepd may echo a malformed
        PMI request into it)."""
        path = self.logs / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def why(self, name: str, out: Path) -> str:
        """What a failed job left: its output, the run's failure.txt, the daemons' last lines."""
        failure = out / "failure.txt"
        daemons = sorted(self.logs.parent.glob("slurmd-*.log"))
        tails = [
            f"--- {p.name}\n"
            + "\n".join([line for line in p.read_text(errors="replace").splitlines() if "gres.conf" not in line][-15:])
            for p in daemons
        ]
        return "\n".join(
            [
                f"--- {name}.out",
                self.log(name),
                f"--- {failure}",
                failure.read_text(errors="replace") if failure.exists() else "(none)",
                *tails,
            ]
        )


@pytest.fixture(scope="module")
def cluster():
    if os.environ.get("CFL_TEST_SLURM") == "0":
        pytest.skip("CFL_TEST_SLURM=0")
    if not sys.platform.startswith("linux"):
        pytest.skip("the local SLURM needs Linux")
    state = Path(tempfile.mkdtemp(prefix="cfl_slurm_"))  # short: munge's socket path; not pytest's rotating tmp
    nodes, daemons = None, {}
    if can_make_nodes() is None:
        nodes = EmulatedNodes(2, state / "nodes")
        daemons = {
            "CFL_SLURM_NODES": " ".join(f"{n.host}:{n.namespace}:{n.address}" for n in nodes.nodes),
            "CFL_SLURM_HEAD": nodes.head,
        }
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(CLUSTER), "start", str(state)],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, **daemons},
        )
        if proc.returncode == 3:
            pytest.skip(proc.stderr.strip())
        assert proc.returncode == 0, proc.stderr
        print(
            f"local SLURM up in {time.monotonic() - started:.1f} s, "
            f"{'each slurmd in an emulated node' if nodes else 'both slurmd on this machine'}"
        )
        logs = state / "logs"
        logs.mkdir()
        env = {
            **os.environ,
            **daemons,
            "SLURM_CONF": str(state / "slurm.conf"),
            "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        yield Cluster(env, logs, nodes)
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=120, env={**os.environ, **daemons})
        if nodes:
            nodes.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def long_jobs(cluster):
    """The uninterrupted run (single_node.sbatch) and the requeued one (requeue.sbatch, its own
    --signal), submitted together as the README says: they run side by side."""
    tag = f"t{os.getpid()}"
    sets = [a for s in LONG for a in ("--set", s)]
    ranks = cluster.run(sys.executable, "-m", "cfl_mpi.commands.ranks", CONFIG, *sets).stdout.strip()
    single = cluster.sbatch(f"{tag}single", f"--ntasks={ranks}", "slurm/single_node.sbatch", CONFIG, *sets)
    requeue = cluster.sbatch(f"{tag}requeue", f"--ntasks={ranks}", "slurm/requeue.sbatch", CONFIG, *sets)
    submitted = time.monotonic()
    folders = [PROJECT_ROOT / "runs" / f"{tag}single-{single}", PROJECT_ROOT / "runs" / f"{tag}requeue-{requeue}"]
    seen: dict[str, float] = {}
    threading.Thread(
        target=warn_mid_run_then_restore, args=(cluster, requeue, folders[1] / "metrics.jsonl", seen), daemon=True
    ).start()
    try:
        yield {
            "single": (f"{tag}single", single),
            "requeue": (f"{tag}requeue", requeue),
            "folders": folders,
            "submitted": submitted,
            "seen": seen,
        }
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def seconds(run_time: str) -> int:
    """scontrol's RunTime, [D-]HH:MM:SS, in seconds."""
    days, _, clock = run_time.rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def warn_mid_run_then_restore(
    cluster: Cluster, job_id: str, metrics: Path, seen: dict[str, float], timeout: float = 1500
) -> None:
    """After WARN_AFTER_ROUND rounds: time limit = elapsed + 5-6 minutes, inside the script's
    10-minute --signal margin. After the requeue: the script's 4 hours again. Records when."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = cluster.job(job_id)
        except AssertionError:  # the cluster stopped
            return
        rounds = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if "limit_cut" not in seen and info["JobState"] == "RUNNING" and rounds >= WARN_AFTER_ROUND:
            minutes = -(-seconds(info["RunTime"]) // 60) + 5
            cluster.run("scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}")
            seen["limit_cut"] = time.monotonic()
        if "limit_cut" in seen and "requeued" not in seen and int(info["Restarts"]) >= 1:
            seen["requeued"] = time.monotonic()
            cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=04:00:00")
        if "requeued" in seen and info["JobState"] == "RUNNING":
            seen["running_again"] = time.monotonic()
            return
        if info["JobState"] in FINAL:
            return
        time.sleep(0.5)


@pytest.mark.timeout(1800)
def test_single_node_job_runs_with_the_default_pmi(cluster, long_jobs):
    name, job_id = long_jobs["single"]
    info = cluster.wait(job_id)
    print(f"single_node.sbatch: {time.monotonic() - long_jobs['submitted']:.1f} s from submission")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), cluster.why(name, long_jobs["folders"][0])
    summary, records = read_results(long_jobs["folders"][0])
    assert summary["ari"] == 1.0 and summary["n_clusters"] == 2
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert "unsupported PMI" not in cluster.log(name)


@pytest.mark.timeout(1800)
def test_requeue_job_is_signalled_requeued_and_resumes_to_the_uninterrupted_result(cluster, long_jobs):
    name, job_id = long_jobs["requeue"]
    info = cluster.wait(job_id)
    seen, start = long_jobs["seen"], long_jobs["submitted"]
    print(
        f"requeue.sbatch: {time.monotonic() - start:.1f} s from submission, {info['Restarts']} restart(s); "
        f"limit cut at {seen.get('limit_cut', 0) - start:.1f} s, requeued at {seen.get('requeued', 0) - start:.1f} s, "
        f"running again {seen.get('running_again', 0) - seen.get('requeued', 0):.1f} s later"
    )
    log = cluster.log(name)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), cluster.why(name, long_jobs["folders"][1])
    assert info["Restarts"] == "1" and "stopped after round" in log and "requeueing job" in log, log
    cluster.wait(long_jobs["single"][1])
    _, full = read_results(long_jobs["folders"][0])
    summary, again = read_results(long_jobs["folders"][1])
    assert "limit_cut" in seen and WARN_AFTER_ROUND <= summary["resumed_after_round"] < ROUNDS  # stopped mid-run
    assert [r["round"] for r in again] == [r["round"] for r in full]
    for a, b in zip(full, again):
        assert (a["clusters"], a["participants"], a["accuracy"]) == (b["clusters"], b["participants"], b["accuracy"])


def test_a_pmi_the_mpi_does_not_speak_fails_in_one_line(cluster):
    name = f"t{os.getpid()}pmix"
    job_id = cluster.sbatch(
        name,
        "--ntasks=3",
        "slurm/single_node.sbatch",
        CONFIG,
        "--set",
        "silos=2",
        "--set",
        "data.rotations=[0, 90]",
        env={"CFL_SRUN_MPI": "pmix"},
    )
    info = cluster.wait(job_id, timeout=300)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0")
    lines = [line for line in cluster.log(name).splitlines() if line.startswith("cfl_mpi")]
    assert len(lines) == 1 and "srun --mpi=pmix did not start one MPI world of 3 ranks" in lines[0]
    assert "set CFL_SRUN_MPI" in lines[0] and "pmi2" in lines[0]


def test_multi_node_gpu_script_is_accepted_as_shipped(cluster):
    proc = cluster.run("sbatch", "--test-only", "slurm/multi_node_gpu.sbatch", "configs/rotated.yaml")
    assert "to start at" in proc.stderr and "using 162 processors" in proc.stderr, proc.stderr


def test_multi_node_gpu_job_runs_the_het_group_srun_line_with_several_silos_per_rank(cluster):
    """Both components for real, on two nodes of their own (a heterogeneous job needs distinct
    nodes), MPI over the network between them; the silo component's ranks host two silos each.
    MPICH's OFI netmod over TCP on the nodes' link: UCX's TCP addresses travel through PMI in
    nine segments, which slurmstepd's pmi2 plugin misparsed in some setups (slurm/README.md)."""
    if cluster.nodes is None:
        pytest.skip(f"a heterogeneous job needs two nodes: {can_make_nodes()}")
    name = f"t{os.getpid()}het"
    sets = [a for s in [*SMALL, "train.rounds=2", "runtime.silos_per_rank=2"] for a in ("--set", s)]
    before = cluster.nodes.link_bytes()
    job_id = cluster.sbatch(
        name, "--ntasks=1", ":", "--ntasks=2", "slurm/multi_node_gpu.sbatch", CONFIG, *sets, env=OFI_TCP
    )
    out = PROJECT_ROOT / "runs" / f"{name}-{job_id}"
    try:
        info = cluster.wait(job_id, timeout=600)
        assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), cluster.why(name, out)
        summary, records = read_results(out)
        assert (summary["ari"], [r["round"] for r in records]) == (1.0, [1, 2]), (summary, records, cluster.log(name))
        assert "4 silos on 2 ranks" in cluster.log(name)
        placed = json.loads((out / "nodes.json").read_text())["nodes"]
        ranks_of = {n["host"]: [r["rank"] for r in n["ranks"]] for n in placed}
        assert sorted(ranks_of) == ["node1", "node2"] and sorted(ranks_of.values()) == [[0], [1, 2]], ranks_of
        crossed = {host: n - before[host] for host, n in cluster.nodes.link_bytes().items()}
        assert all(n > 100_000 for n in crossed.values()), crossed  # the models and updates, both ways
        print(f"het job across two nodes: {crossed} bytes over the links")
        wrong = cluster.sbatch(
            f"{name}wrong", "--ntasks=1", ":", "--ntasks=4", "slurm/multi_node_gpu.sbatch", CONFIG, *sets
        )
        assert cluster.wait(wrong, timeout=300)["ExitCode"] == "2:0"
        assert (
            "needs 2 silo ranks but the job's silo component has 4 tasks (submit with --ntasks=1 : --ntasks=2)"
            in cluster.log(f"{name}wrong")
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_a_rank_that_dies_under_srun_is_named_with_its_silos_and_node(cluster):
    """The sbatch scripts run srun watched (cfl_mpi/commands/supervise.py): silo 2 exits without a word
    in round 2 (its rank, 2, hosts silos 2-3, on the second node); srun ends the job, and one
    line of cfl_mpi's in the log and failure.txt names the rank, its silos and its node."""
    if cluster.nodes is None:
        pytest.skip(f"a heterogeneous job needs two nodes: {can_make_nodes()}")
    name = f"t{os.getpid()}dies"
    sets = [a for s in [*SMALL, "train.rounds=3", "runtime.silos_per_rank=2", "runtime.fault.silo=2",
                        "runtime.fault.round=2", "runtime.fault.kind=exit"] for a in ("--set", s)]  # fmt: skip
    job_id = cluster.sbatch(
        name, "--ntasks=1", ":", "--ntasks=2", "slurm/multi_node_gpu.sbatch", CONFIG, *sets, env=OFI_TCP
    )
    out = PROJECT_ROOT / "runs" / f"{name}-{job_id}"
    try:
        info = cluster.wait(job_id, timeout=600)
        log = cluster.log(name)
        assert info["JobState"] == "FAILED", (info, log)
        host = next(
            n["host"]
            for n in json.loads((out / "nodes.json").read_text())["nodes"]
            if any(r["rank"] == 2 for r in n["ranks"])
        )
        line = f"cfl_mpi: rank 2 (silos 2-3) on {host} ended (Exited with exit code"
        assert line in log and line in (out / "failure.txt").read_text(), log
        assert "the checkpoint after round 1 is intact" in log
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_launch_print_gives_the_lines_that_submit_the_config(cluster):
    proc = cluster.run(
        sys.executable,
        "-m",
        "cfl_mpi.commands.launch",
        "--print",
        CONFIG,
        "--set",
        "silos=40",
        "--set",
        "runtime.silos_per_rank=5",
    )
    lines = proc.stdout.splitlines()
    assert "9 ranks (1 server + 8 silo ranks)" in lines[0]
    assert f"srun --mpi=pmi2 --ntasks=9 --kill-on-bad-exit=1 python -m cfl_mpi.main {CONFIG}" in proc.stdout
    assert f"sbatch --ntasks=1 : --ntasks=8 slurm/multi_node_gpu.sbatch {CONFIG}" in proc.stdout
    # the single-node line, as printed, is accepted by this SLURM
    single = next(line for line in lines if "single_node.sbatch" in line).split()
    assert "to start at" in cluster.run(single[0], "--test-only", *single[1:]).stderr


def test_a_node_lost_under_srun_is_named_with_its_ranks_and_silos(cluster):
    """Every process of the silos' node SIGKILLed (its slurmd too) in round 2, and the node
    marked down as SLURM's controller does once it stops answering (SlurmdTimeout, 300 s by
    default: brought forward with scontrol): the job ends, and one line of cfl_mpi's names
    the node, its ranks and its silos. Last in the module: the node's slurmd is gone."""
    if cluster.nodes is None:
        pytest.skip(f"a heterogeneous job needs two nodes: {can_make_nodes()}")
    name = f"t{os.getpid()}lost"
    sets = [a for s in [*SMALL, "train.rounds=40", "runtime.silos_per_rank=2"] for a in ("--set", s)]
    job_id = cluster.sbatch(
        name, "--ntasks=1", ":", "--ntasks=2", "slurm/multi_node_gpu.sbatch", CONFIG, *sets, env=OFI_TCP
    )
    out = PROJECT_ROOT / "runs" / f"{name}-{job_id}"
    try:
        deadline = time.monotonic() + 300
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
            assert time.monotonic() < deadline and cluster.job(job_id)["JobState"] not in FINAL, cluster.why(name, out)
            time.sleep(0.2)
        silo_host = next(
            n["host"]
            for n in json.loads((out / "nodes.json").read_text())["nodes"]
            if all(r["rank"] != 0 for r in n["ranks"])
        )
        killed = time.monotonic()
        cluster.nodes.kill(silo_host)
        cluster.run("scontrol", "update", f"NodeName={silo_host}", "State=DOWN", "Reason=lost")
        while (state := cluster.job(job_id)["JobState"]) in ("RUNNING", "COMPLETING"):  # SLURM requeues it
            assert time.monotonic() - killed < 300, f"job {job_id} still {state} 300 s after its node was lost"
            time.sleep(0.5)
        time.sleep(2)
        log = cluster.log(name)
        print(f"node {silo_host} lost: the job left its nodes ({state}) {time.monotonic() - killed:.1f} s later")
        print(log[-3000:])
        failure = (out / "failure.txt").read_text() if (out / "failure.txt").exists() else ""
        print(failure)
        assert f"node {silo_host} lost" in failure and "ranks 1-2 (silos 0-3)" in failure, cluster.why(name, out)
    finally:
        cluster.run("scancel", job_id, check=False)
        shutil.rmtree(out, ignore_errors=True)
